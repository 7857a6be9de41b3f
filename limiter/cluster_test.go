package limiter

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-proxy/sluice/internal/redistest"
)

func newClusterRedis(t testing.TB, c *redistest.Cluster, opt RedisOptions) *Redis {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true,
		DialTimeout: storeTimeout, ReadTimeout: storeTimeout, WriteTimeout: storeTimeout})
	t.Cleanup(func() { cc.Close() })
	return NewRedis(cc, opt)
}

// TestCluster runs every script on a real 3-primary Redis Cluster: the
// shared semantics (admit, settle, status), the heartbeat pipeline (renew
// and node scripts across slots) and the exactness test.
func TestCluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	t.Run("semantics", func(t *testing.T) {
		for _, sc := range semanticsCases {
			t.Run(sc.name, func(t *testing.T) {
				t.Parallel()
				sc.run(t, newClusterRedis(t, c, RedisOptions{}), t.Name())
			})
		}
	})
	t.Run("heartbeat", func(t *testing.T) {
		r := newClusterRedis(t, c, RedisOptions{})
		lim := Limits{MaxConcurrency: 5, Models: map[string]Limits{"m": {MaxConcurrency: 2}}}
		var tickets []*Ticket
		for i, tenant := range []string{"alpha", "beta", "we{ird}:ten%ant", "delta", "}epsilon{", "zeta"} {
			model := ""
			if i%2 == 0 {
				model = "m"
			}
			d := admit(t, r, Request{Tenant: tenant, Model: model, Limits: lim})
			tickets = append(tickets, d.Ticket)
		}
		if err := r.Beat(context.Background()); err != nil {
			t.Fatalf("Beat on the cluster: %v", err)
		}
		if r.Nodes() != 1 {
			t.Errorf("Nodes() = %d; want 1", r.Nodes())
		}
		st := snapshot(t, r, "alpha", lim)
		if len(st.Models) != 1 || st.Models[0].InFlight != 1 {
			t.Errorf("alpha status %+v; want one lease in model m", st)
		}
		for _, tk := range tickets {
			settle(t, r, tk, Usage{})
		}
	})
	t.Run("exactness", func(t *testing.T) {
		runExactness(t, func(t *testing.T) Limiter { return newClusterRedis(t, c, RedisOptions{}) }, "cl-exact")
	})
}
