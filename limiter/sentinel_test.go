package limiter

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/redistest"
)

// Redis topologies (issue 19 item 4): Sentinel through go-redis'
// universal client, TLS with a private CA and a client certificate, and an
// ACL user with only the commands the limiter uses, each against real
// redis-server processes started by internal/redistest.

// sentinelConfig is a redis: section naming ss's sentinels.
func sentinelConfig(ss *redistest.SentinelSet) RedisConfig {
	return RedisConfig{Sentinel: SentinelConfig{MasterName: redistest.MasterName, Addrs: ss.Addrs()}}
}

// runNode starts a Shared from cfg with NewFromConfig, runs its heartbeat,
// and stops and closes it when the test ends.
func runNode(t *testing.T, cfg RedisConfig) *Shared {
	t.Helper()
	s, err := NewFromConfig(cfg, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("NewFromConfig: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { _ = s.Run(ctx); close(ran) }()
	t.Cleanup(func() {
		cancel()
		<-ran
		_ = s.Close()
	})
	return s
}

// inFlight is the number of live leases of tenant in the Redis at addr,
// read with the status script on a plain client of that server.
func inFlight(t *testing.T, addr, tenant string, lim Limits) int64 {
	t.Helper()
	st, err := newRedis(t, addr, RedisOptions{}).Snapshot(context.Background(), tenant, lim)
	if err != nil {
		t.Fatalf("Snapshot on %s: %v", addr, err)
	}
	return st.InFlight
}

func TestSentinelAdmissionsShared(t *testing.T) {
	t.Parallel()
	ss := redistest.StartSentinel(t)
	cfg := sentinelConfig(ss)
	cfg.AdmissionTimeout, cfg.ReadTimeout, cfg.WriteTimeout = storeTimeout, storeTimeout, storeTimeout
	a, b := runNode(t, cfg), runNode(t, cfg)
	lim := Limits{MaxConcurrency: 2}
	var held []*Ticket
	for i, n := range []*Shared{a, b, a} {
		d := admit(t, n, Request{Tenant: "sn", Limits: lim})
		if d.Degraded || d.Allowed != (i < 2) {
			t.Fatalf("admission %d: %+v; want shared, 2 of 3 admitted across two nodes", i, d)
		}
		if d.Allowed {
			held = append(held, d.Ticket)
		}
	}
	// The leases are on the master the sentinels name, not the replica's
	// own writes (a replica refuses writes).
	if got := inFlight(t, ss.Master.Addr(), "sn", lim); got != 2 {
		t.Errorf("leases on the master = %d; want 2", got)
	}
	settle(t, a, held[0], Usage{})
	settle(t, b, held[1], Usage{})
	if got := inFlight(t, ss.Master.Addr(), "sn", lim); got != 0 {
		t.Errorf("leases after settling = %d; want 0", got)
	}
}

// failoverLoad is the outcome of admitting under load across a failover.
type failoverLoad struct {
	shared, degraded, admitted, refused int64
	peak                                int64 // most requests admitted at once, seen by the callers
	errs                                []string
	// settleErrs counts Settle errors: a settle that timed out on the dead
	// master is queued for the heartbeat (and the resend after the switch);
	// the proxy only logs it, after the response (proxy/handler.go
	// SettleDone), so it is no client error. checkAfterFailover's lease
	// count proves they were applied.
	settleErrs int64
}

// admitAcrossFailover runs workers on nodes, each admitting, holding an
// admitted request 2-10 ms and settling it, while trigger runs (the
// failover); it goes on for settleFor after trigger returns. Bounded:
// at most 20000 admissions and 60 s.
func admitAcrossFailover(t *testing.T, nodes []*Shared, lim Limits, tenant string, trigger func(), settleFor time.Duration) failoverLoad {
	t.Helper()
	var (
		res    failoverLoad
		mu     sync.Mutex
		cur    atomic.Int64
		total  atomic.Int64
		stop   = make(chan struct{})
		wg     sync.WaitGroup
		deadln = time.Now().Add(60 * time.Second)
		errorf = func(format string, args ...any) {
			mu.Lock()
			res.errs = append(res.errs, fmt.Sprintf(format, args...))
			mu.Unlock()
		}
		workers = 3 * len(nodes)
	)
	for w := 0; w < workers; w++ {
		node := nodes[w%len(nodes)]
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if total.Add(1) > 20000 || time.Now().After(deadln) {
					return
				}
				d, err := node.Admit(context.Background(), Request{ID: nextID(), Tenant: tenant, Limits: lim})
				if err != nil {
					errorf("Admit: %v", err)
					continue
				}
				mu.Lock()
				if d.Degraded {
					res.degraded++
				} else {
					res.shared++
				}
				mu.Unlock()
				if !d.Allowed {
					atomic.AddInt64(&res.refused, 1)
					if d.Reason != "concurrency" {
						errorf("refused for %q (degraded %v); want only concurrency refusals under the local policy", d.Reason, d.Degraded)
					}
					time.Sleep(time.Millisecond)
					continue
				}
				atomic.AddInt64(&res.admitted, 1)
				n := cur.Add(1)
				mu.Lock()
				res.peak = max(res.peak, n)
				mu.Unlock()
				time.Sleep(time.Duration(2+i%9) * time.Millisecond)
				cur.Add(-1)
				if err := node.Settle(context.Background(), d.Ticket, Usage{}); err != nil {
					if !errors.Is(err, ErrSettleDeferred) {
						errorf("Settle: %v", err)
					}
					atomic.AddInt64(&res.settleErrs, 1)
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond) // admissions under way before the failover
	trigger()
	time.Sleep(settleFor)
	close(stop)
	wg.Wait()
	return res
}

// checkAfterFailover asserts what a failover must leave: no client error,
// shared admissions on the new master again (the limit enforced exactly,
// leases there), and no lease left once every request has settled.
func checkAfterFailover(t *testing.T, ss *redistest.SentinelSet, nodes []*Shared, lim Limits, tenant string, res failoverLoad, bound time.Duration) {
	t.Helper()
	t.Logf("across the failover: %d shared and %d degraded decisions, %d admitted, %d refused, peak %d in flight (limit %d), %d settles retried later",
		res.shared, res.degraded, res.admitted, res.refused, res.peak, lim.MaxConcurrency, res.settleErrs)
	for _, e := range res.errs[:min(len(res.errs), 5)] {
		t.Errorf("client error: %s", e)
	}
	if len(res.errs) > 0 {
		t.Errorf("%d client errors; want none beyond the local policy's decisions", len(res.errs))
	}
	if res.admitted == 0 {
		t.Fatal("nothing admitted: the load did not run")
	}
	// A degraded node admits up to its share (rounded up) locally, without
	// a lease in Redis; when the store answers again the shared decisions
	// do not see those requests, so until they end the region may hold the
	// limit plus every node's share: limit + N×ceil(limit/N)
	// (docs/SCALING.md, "Redis topologies"). Shared decisions alone may
	// exceed the limit by the admissions the old master took after the
	// promotion, lost with its writes until their node re-asserts them
	// at the switch (at most the limit, which the old master enforced):
	// seen once in 15 runs (peak 7 of 6) once lost settles no longer
	// block the new master's slots.
	limit := int64(lim.MaxConcurrency)
	share := (limit + int64(len(nodes)) - 1) / int64(len(nodes))
	if bound := limit + int64(len(nodes))*share; res.peak > bound {
		t.Errorf("peak in flight %d; want at most %d (%d degraded decisions)", res.peak, bound, res.degraded)
	} else if res.peak > limit {
		t.Logf("peak in flight %d over the limit %d (%d degraded decisions): admissions lost with the old master or degraded ones", res.peak, limit, res.degraded)
	}
	master := ss.CurrentMaster()
	if master != ss.Replica {
		t.Fatalf("current master %v; want the promoted replica %s", master, ss.Replica.Addr())
	}
	// Every request has settled: no lease may be left on the new master. A
	// settle the old master took after the promotion is lost with its
	// writes; the node sends its recent settles again when it meets the
	// new master (resettle.go), so the slot comes back within bound, not
	// when the unrenewed lease expires (lease_ttl).
	first := inFlight(t, master.Addr(), tenant, lim)
	left, waited := first, time.Now()
	for deadline := time.Now().Add(bound); left != 0 && time.Now().Before(deadline); left = inFlight(t, master.Addr(), tenant, lim) {
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("leases on the new master once every request settled: %d at once, %d after %v", first, left, time.Since(waited).Round(time.Millisecond))
	if left != 0 {
		t.Errorf("%d leases left on the new master %v after every request settled; want 0", left, bound)
	}
	// Shared again: the limit is enforced exactly through the new master,
	// from every node, with the leases there.
	// The breaker closes on a successful probe, which only an admission
	// makes (breaker.go): probe as traffic would.
	deadline := time.Now().Add(20 * time.Second)
	for _, n := range nodes {
		for n.Degraded() {
			if time.Now().After(deadline) {
				t.Fatal("breaker still open 20s after the failover")
			}
			if d, err := n.Admit(context.Background(), Request{ID: nextID(), Tenant: tenant + "-probe", Limits: Limits{MaxConcurrency: 100}}); err == nil && d.Allowed {
				_ = n.Settle(context.Background(), d.Ticket, Usage{})
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	var held []*Ticket
	var heldBy []*Shared
	for i := 0; i < lim.MaxConcurrency+len(nodes); i++ {
		n := nodes[i%len(nodes)]
		d := admit(t, n, Request{Tenant: tenant, Limits: lim})
		if d.Degraded {
			t.Fatalf("admission %d after the failover degraded: %+v; want shared", i, d)
		}
		if d.Allowed != (i < lim.MaxConcurrency) {
			t.Fatalf("admission %d after the failover: allowed %v; want exactly %d admitted", i, d.Allowed, lim.MaxConcurrency)
		}
		if d.Allowed {
			held, heldBy = append(held, d.Ticket), append(heldBy, n)
		}
	}
	if got := inFlight(t, master.Addr(), tenant, lim); got != int64(lim.MaxConcurrency) {
		t.Errorf("leases on the new master = %d; want %d", got, lim.MaxConcurrency)
	}
	for i, tk := range held {
		settle(t, heldBy[i], tk, Usage{})
	}
	if got := inFlight(t, master.Addr(), tenant, lim); got != 0 {
		t.Errorf("leases after the last settle = %d; want 0", got)
	}
}

// sentinelNodes starts three nodes on ss with the production defaults
// (admission 500ms, read/write 500ms, breaker 3 failures, 1s cool-down)
// and lease_ttl leaseTTL.
func sentinelNodes(t *testing.T, ss *redistest.SentinelSet, leaseTTL time.Duration) []*Shared {
	cfg := sentinelConfig(ss)
	cfg.LeaseTTL, cfg.Nodes = leaseTTL, 3
	return []*Shared{runNode(t, cfg), runNode(t, cfg), runNode(t, cfg)}
}

func TestSentinelFailoverWhileAdmitting(t *testing.T) {
	t.Parallel()
	ss := redistest.StartSentinel(t)
	// The production lease_ttl (30s): a settle lost with the old master
	// must come back within 2s of the end of the load (itself 1s after
	// the switch), not when its lease expires.
	nodes := sentinelNodes(t, ss, 30*time.Second)
	lim := Limits{MaxConcurrency: 6, OnStoreFailure: PolicyLocal}
	res := admitAcrossFailover(t, nodes, lim, "fo", func() {
		if now := ss.Failover(); now != ss.Replica {
			t.Fatalf("new master %s; want the replica", now.Addr())
		}
	}, time.Second)
	// The promoted replica's script cache is its own: flush it so that the
	// next admissions meet NOSCRIPT, which redis.Script answers with EVAL.
	if _, err := ss.Replica.Do("SCRIPT", "FLUSH"); err != nil {
		t.Fatalf("SCRIPT FLUSH: %v", err)
	}
	checkAfterFailover(t, ss, nodes, lim, "fo", res, 2*time.Second)
	sha := sha1.Sum([]byte(admitLua))
	if got, err := ss.Replica.Do("SCRIPT", "EXISTS", hex.EncodeToString(sha[:])); err != nil || got != "1" {
		t.Errorf("SCRIPT EXISTS admit on the new master = %q, %v; want loaded again after NOSCRIPT", got, err)
	}
}

func TestSentinelMasterKilledWhileAdmitting(t *testing.T) {
	t.Parallel()
	ss := redistest.StartSentinel(t)
	nodes := sentinelNodes(t, ss, 30*time.Second) // production lease_ttl
	lim := Limits{MaxConcurrency: 6, OnStoreFailure: PolicyLocal}
	res := admitAcrossFailover(t, nodes, lim, "kill", func() {
		ss.Master.Kill() // SIGKILL: the sentinels agree on its death after 1s, then elect and promote
		ss.WaitNewMaster(ss.Master)
	}, time.Second)
	checkAfterFailover(t, ss, nodes, lim, "kill", res, 2*time.Second)
}

func TestRedisTLSWithCAAndClientCert(t *testing.T) {
	t.Parallel()
	f := redistest.WriteTLSFiles(t)
	srv := redistest.StartTLS(t, f, true)
	base := RedisConfig{Addrs: []string{srv.TLSAddr()}, TLS: true, TLSCAFile: f.CA,
		AdmissionTimeout: storeTimeout, DialTimeout: storeTimeout, ReadTimeout: storeTimeout, WriteTimeout: storeTimeout}
	lim := Limits{MaxConcurrency: 1}

	good := base
	good.TLSCertFile, good.TLSKeyFile = f.ClientCert, f.ClientKey
	good.TLSServerName = redistest.TLSServerName
	s := runNode(t, good)
	d := admit(t, s, Request{Tenant: "tls", Limits: lim})
	if !d.Allowed || d.Degraded {
		t.Fatalf("decision %+v; want a shared admission over TLS", d)
	}
	if got := inFlight(t, srv.Addr(), "tls", lim); got != 1 {
		t.Errorf("leases on the server = %d; want the TLS admission's 1", got)
	}
	settle(t, s, d.Ticket, Usage{})

	// Without the client certificate the server refuses the handshake
	// (tls-auth-clients yes), and with the system roots it is not trusted:
	// both fail, so the store-failure policy decides.
	noCert := base
	noCert.AdmissionTimeout, noCert.DialTimeout = time.Second, time.Second
	noRoots := noCert
	noRoots.TLSCAFile = ""
	noRoots.TLSCertFile, noRoots.TLSKeyFile = f.ClientCert, f.ClientKey
	for name, cfg := range map[string]RedisConfig{"no client cert": noCert, "system roots": noRoots} {
		c, err := newUniversalClient(cfg.WithDefaults())
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		err = c.Ping(context.Background()).Err()
		c.Close()
		if err == nil {
			t.Errorf("%s: PING over TLS succeeded; want the handshake refused", name)
		}
	}
	if err := (RedisConfig{Addrs: []string{srv.TLSAddr()}, TLSCAFile: f.CA}).WithDefaults().Validate(); err == nil ||
		!strings.Contains(err.Error(), "tls_ca_file: is set but tls is false") {
		t.Errorf("Validate without tls: %v; want tls_ca_file refused", err)
	}
	bad := RedisConfig{Addrs: []string{srv.TLSAddr()}, TLS: true, TLSCAFile: f.ClientKey}.WithDefaults()
	var fe *FieldError
	if err := bad.Validate(); !errors.As(err, &fe) || fe.Field != "tls_ca_file" {
		t.Errorf("Validate with a key as CA: %v; want a tls_ca_file error", err)
	}
}

// sluiceACL is the least a Redis 6+ ACL user needs for Sluice: the
// commands the client sends (EVALSHA, EVAL, SCRIPT LOAD at start, TIME,
// GET, ZREM, PING, HELLO;
// CLIENT SETINFO on Redis 7.2+, optional: go-redis ignores its refusal)
// and those the Lua scripts call (INFO among them: admit.lua's restart
// window, resettle.go's run_id), on the tenant keys
// ({t:...}) and the node set. docs/OPERATIONS.md shows it.
var sluiceACL = []string{"on", ">s3cret-acl", "resetkeys", "~{t:*", "~sluice:nodes", "resetchannels", "-@all",
	"+evalsha", "+eval", "+script|load", "+time", "+ping", "+hello", "+info",
	"+get", "+set", "+del", "+pexpire", "+pttl", "+zadd", "+zcard", "+zcount", "+zrem", "+zremrangebyscore"}

func TestRedisACLUserLeastPrivilege(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	if _, err := srv.Do(append([]string{"ACL", "SETUSER", "sluice"}, sluiceACL...)...); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	cfg := RedisConfig{Addrs: []string{srv.Addr()}, Username: "sluice", Password: "s3cret-acl", LeaseTTL: 600 * time.Millisecond,
		AdmissionTimeout: storeTimeout, DialTimeout: storeTimeout, ReadTimeout: storeTimeout, WriteTimeout: storeTimeout}
	s := runNode(t, cfg)
	lim := Limits{MaxConcurrency: 1, TokensPerMinute: 1000, RequestsPerMinute: 100,
		Models: map[string]Limits{"m": {MaxConcurrency: 1}}}
	d := admit(t, s, Request{Tenant: "acl", Model: "m", Limits: lim, InputTokens: 10})
	if !d.Allowed || d.Degraded {
		t.Fatalf("decision %+v; want a shared admission as the ACL user", d)
	}
	time.Sleep(time.Second) // heartbeats renew the lease (renew script, node set)
	if st := snapshot(t, s, "acl", lim); len(st.Models) != 1 || st.Models[0].InFlight != 1 || st.Degraded {
		t.Errorf("status %+v; want the lease kept by the heartbeat", st)
	}
	settle(t, s, d.Ticket, Usage{InputTokens: 5, OutputTokens: 7})
	d = admit(t, s, Request{Tenant: "acl", Model: "m", Limits: lim})
	if !d.Allowed || d.Degraded {
		t.Fatalf("second decision %+v; want shared", d)
	}
	settle(t, s, d.Ticket, Usage{})
	// Nothing was denied on the way (ACL LOG lists every denial, those
	// go-redis ignores such as CLIENT SETINFO too), and the connections
	// were the ACL user's.
	if got, err := srv.Do("ACL", "LOG"); err != nil || got != "" {
		t.Errorf("ACL LOG: %q, %v; want no denial", got, err)
	}
	if got, err := srv.Do("CLIENT", "LIST"); err != nil || !strings.Contains(got, "user=sluice") {
		t.Errorf("CLIENT LIST: %q, %v; want connections of user sluice", got, err)
	}
	// A wrong password is refused: the policy decides (degraded), nothing
	// reaches Redis.
	wrong := cfg
	wrong.Password, wrong.AdmissionTimeout = "nope", time.Second
	c, err := newUniversalClient(wrong.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Errorf("PING with a wrong password: %v; want WRONGPASS", err)
	}
}

// sentinelACL is the least a sentinel user needs for go-redis' failover
// client (v9.23.0 sentinel.go: SENTINEL GET-MASTER-ADDR-BY-NAME, SENTINEL
// SENTINELS, SUBSCRIBE +switch-master +replica-reconf-done, PING).
var sentinelACL = []string{"on", ">s3cret-sentinel", "-@all", "+sentinel|get-master-addr-by-name",
	"+sentinel|sentinels", "+subscribe", "+ping", "+hello", "resetchannels", "&+switch-master", "&+replica-reconf-done"}

func TestSentinelACLUsersAcrossFailover(t *testing.T) {
	t.Parallel()
	ss := redistest.StartSentinel(t)
	for _, s := range []*redistest.Server{ss.Master, ss.Replica} {
		if _, err := s.Do(append([]string{"ACL", "SETUSER", "sluice"}, sluiceACL...)...); err != nil {
			t.Fatalf("ACL SETUSER sluice on %s: %v", s.Addr(), err)
		}
	}
	for _, s := range ss.Sentinels {
		if _, err := s.Do(append([]string{"ACL", "SETUSER", "sluice-sentinel"}, sentinelACL...)...); err != nil {
			t.Fatalf("ACL SETUSER on sentinel %s: %v", s.Addr(), err)
		}
	}
	cfg := sentinelConfig(ss)
	cfg.Sentinel.Username, cfg.Sentinel.Password = "sluice-sentinel", "s3cret-sentinel"
	cfg.Username, cfg.Password = "sluice", "s3cret-acl"
	cfg.AdmissionTimeout, cfg.ReadTimeout, cfg.WriteTimeout = storeTimeout, storeTimeout, storeTimeout
	s := runNode(t, cfg)
	lim := Limits{MaxConcurrency: 1}
	d := admit(t, s, Request{Tenant: "acl-sn", Limits: lim})
	if !d.Allowed || d.Degraded {
		t.Fatalf("decision %+v; want shared through the sentinels' ACL user", d)
	}
	settle(t, s, d.Ticket, Usage{})
	ss.Failover()
	// The client follows the switch; admissions are shared on the new
	// master as its ACL user (a few may fail while it switches).
	deadline := time.Now().Add(20 * time.Second)
	for {
		d, err := s.Store().Admit(context.Background(), Request{ID: nextID(), Tenant: "acl-sn", Limits: lim})
		if err == nil && d.Allowed {
			settle(t, s.Store(), d.Ticket, Usage{})
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no admission on the new master within 20s: %+v, %v", d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got, err := ss.Replica.Do("CLIENT", "LIST"); err != nil || !strings.Contains(got, "user=sluice ") {
		t.Errorf("CLIENT LIST on the new master: %q, %v; want the sluice user's connections", got, err)
	}
	for _, srv := range append([]*redistest.Server{ss.Master, ss.Replica}, ss.Sentinels...) {
		if got, err := srv.Do("ACL", "LOG"); err != nil || got != "" {
			t.Errorf("ACL LOG on %s: %q, %v; want no denial", srv.Addr(), got, err)
		}
	}
	var subscribed bool
	for _, srv := range ss.Sentinels {
		got, _ := srv.Do("CLIENT", "LIST")
		subscribed = subscribed || strings.Contains(got, "user=sluice-sentinel")
	}
	if !subscribed {
		t.Error("no sentinel has a connection of user sluice-sentinel")
	}
}

func TestRedisTopologyValidate(t *testing.T) {
	sn := SentinelConfig{MasterName: "m", Addrs: []string{"127.0.0.1:26379"}}
	for _, c := range []struct {
		name string
		cfg  RedisConfig
		want []string // fields of the errors, in order; none: valid
	}{
		{"sentinel", RedisConfig{Sentinel: sn}, nil},
		{"sentinel without master", RedisConfig{Sentinel: SentinelConfig{Addrs: sn.Addrs}}, []string{"sentinel.master_name"}},
		{"master without sentinels", RedisConfig{Sentinel: SentinelConfig{MasterName: "m"}}, []string{"sentinel.addrs"}},
		{"bad sentinel address", RedisConfig{Sentinel: SentinelConfig{MasterName: "m", Addrs: []string{"x"}}}, []string{"sentinel.addrs[0]"}},
		{"addrs and sentinel", RedisConfig{Addrs: []string{"127.0.0.1:6379"}, Sentinel: sn}, []string{"addrs"}},
		{"cluster and sentinel", RedisConfig{Cluster: true, Sentinel: sn}, []string{"cluster"}},
		{"tls file without tls", RedisConfig{Sentinel: sn, TLSServerName: "r"}, []string{"tls_server_name"}},
		{"cert without key", RedisConfig{Sentinel: sn, TLS: true, TLSCertFile: "c.pem"}, []string{"tls_cert_file"}},
		{"tls with system roots", RedisConfig{Sentinel: sn, TLS: true, TLSServerName: "r"}, nil},
	} {
		err := c.cfg.WithDefaults().Validate()
		var got []string
		for _, e := range unjoinErr(err) {
			var fe *FieldError
			if !errors.As(e, &fe) {
				t.Errorf("%s: %v is not a FieldError", c.name, e)
				continue
			}
			got = append(got, fe.Field)
		}
		if strings.Join(got, ",") != strings.Join(c.want, ",") {
			t.Errorf("%s: errors on %v (%v); want %v", c.name, got, err, c.want)
		}
		if c.want == nil && !c.cfg.Enabled() {
			t.Errorf("%s: not Enabled", c.name)
		}
	}
}

func unjoinErr(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func TestSentinelOverTLSAcrossFailover(t *testing.T) {
	t.Parallel()
	f := redistest.WriteTLSFiles(t)
	ss := redistest.StartSentinelTLS(t, f)
	cfg := sentinelConfig(ss) // the sentinels' TLS ports; they name the data nodes' TLS ports
	cfg.TLS, cfg.TLSCAFile, cfg.TLSServerName = true, f.CA, redistest.TLSServerName
	cfg.AdmissionTimeout, cfg.ReadTimeout, cfg.WriteTimeout = storeTimeout, storeTimeout, storeTimeout
	s := runNode(t, cfg)
	lim := Limits{MaxConcurrency: 1}
	d := admit(t, s, Request{Tenant: "tls-sn", Limits: lim})
	if !d.Allowed || d.Degraded {
		t.Fatalf("decision %+v; want shared over TLS through the sentinels", d)
	}
	if got := inFlight(t, ss.Master.Addr(), "tls-sn", lim); got != 1 {
		t.Errorf("leases on the master = %d; want 1", got)
	}
	settle(t, s, d.Ticket, Usage{})
	ss.Failover()
	deadline := time.Now().Add(20 * time.Second)
	for {
		d, err := s.Store().Admit(context.Background(), Request{ID: nextID(), Tenant: "tls-sn", Limits: lim})
		if err == nil && d.Allowed {
			if got := inFlight(t, ss.Replica.Addr(), "tls-sn", lim); got != 1 {
				t.Errorf("leases on the new master = %d; want 1", got)
			}
			settle(t, s.Store(), d.Ticket, Usage{})
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no admission on the new master over TLS within 20s: %+v, %v", d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Without the private CA the sentinels themselves are not trusted.
	plain := cfg
	plain.TLSCAFile = ""
	c, err := newUniversalClient(plain.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err == nil {
		t.Error("PING through the sentinels with the system roots succeeded; want the certificate refused")
	}
}
