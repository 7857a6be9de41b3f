package node

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/redistest"
	"github.com/sluice-proxy/sluice/limiter"
)

// A node with a region section admits through its regional Redis with
// the region's share of the tenant's global limits, and shows the share
// at /v1/usage and GET /debug/regions on the admin listener.
func TestRegionNodeShowsShare(t *testing.T) {
	t.Parallel()
	regional, global := redistest.Start(t), redistest.Start(t)
	cfg := nodeConfig{Node: "region: fra", Tenants: tenant("t1", "tokens_per_minute: 600000, max_concurrency: 100", key1)}.String() +
		fmt.Sprintf("redis: {addrs: [%q]}\nregion:\n  regions: [fra, iad]\n  global_store: {addrs: [%q]}\n  interval: 100ms\n",
			regional.Addr(), global.Addr())
	tn := startFileNode(t, cfg)
	rg, ok := tn.n.limiter.(*limiter.Region)
	if !ok {
		t.Fatalf("the node's limiter is %T, want *limiter.Region", tn.n.limiter)
	}
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		r := stream(ctx, tn.base, key1, "sim-small", 8)
		cancel()
		if r.err != nil || r.status != http.StatusOK || !r.done {
			t.Fatalf("stream: %d %v %q", r.status, r.err, r.last)
		}
	}
	waitFor(t, 20*time.Second, "a rebalancing round", func() bool { ok, _ := rg.Syncs(); return ok > 0 })

	req, _ := http.NewRequest(http.MethodGet, tn.base+"/v1/usage", nil)
	req.Header.Set("Authorization", "Bearer "+key1)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var st struct {
		Tokens struct{ Limit int64 } `json:"tokens"`
		Region *limiter.RegionStatus `json:"region"`
	}
	if err := json.Unmarshal(body, &st); err != nil || st.Region == nil {
		t.Fatalf("/v1/usage: %d %v %s", resp.StatusCode, err, body)
	}
	if st.Region.Name != "fra" || st.Region.Share <= 0 || st.Region.Share > 1 || st.Region.GlobalTokensPerMinute != 600000 {
		t.Errorf("usage region %+v", *st.Region)
	}
	if want := int64(600000 * st.Region.Share); st.Tokens.Limit < want-1 || st.Tokens.Limit > want+1 {
		t.Errorf("usage tokens limit %d; want the region's share %d", st.Tokens.Limit, want)
	}

	var rep limiter.RegionReport
	if err := json.Unmarshal([]byte(tn.get(tn.admin+"/debug/regions")), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Region != "fra" || len(rep.Regions) != 2 || rep.Syncs == 0 || !rep.Reachable {
		t.Errorf("/debug/regions %+v", rep)
	}
	if s, ok := rep.Tenants["t1"]; !ok || s.Share <= 0 {
		t.Errorf("/debug/regions has no share for t1: %+v", rep.Tenants)
	}
}
