package node

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/configs"
	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/proxy"
)

// Many streams run while the config is swapped again and again: the pool
// moves between simulators, a simulator the streams run on is replaced,
// routes come and go. Every stream ends with [DONE]; a route added by a
// reload answers as soon as the reload returns; replaced simulators stop
// once their streams are done; no concurrency lease is left behind.
func TestReloadUnderLoad(t *testing.T) {
	tn := startFileNode(t, nodeConfig{}.String())
	const workers, reloads = 6, 10
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var results []streamResult
	ended := make(chan struct{}, 1024) // one per stream that ended
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r := stream(ctx, tn.base, key1, "sim-small", 20)
				mu.Lock()
				results = append(results, r)
				mu.Unlock()
				select {
				case ended <- struct{}{}:
				default:
				}
			}
		}()
	}
	waitFor(t, 5*time.Second, "streams in flight", func() bool { return tn.n.handler.Snapshot().InFlight >= workers/2 })

	var replaced []string // URLs of simulators a reload replaced
	busyReplaced, swapsUnderLoad := 0, 0
	for i := 1; i <= reloads; i++ {
		backend := []string{"gpu-a", "gpu-b"}[i%2]
		model := fmt.Sprintf("m%d", i)
		cfg := nodeConfig{
			// gpu-b's settings change every other reload: it is restarted
			// while streams run on it.
			Sims: testSim("gpu-a", "sim-small", 1) + testSim("gpu-b", "sim-small", 2+i/2) + testSim("gpu-"+model, model, i),
			Pools: fmt.Sprintf("  - {name: p, backends: [{url: \"sim://%s\"}]}\n  - {name: p%s, backends: [{url: \"sim://gpu-%s\"}]}\n",
				backend, model, model),
			Routes: fmt.Sprintf("  - {name: main, path: /v1/, models: [sim-small], pool: p}\n  - {name: %s, path: /v1/, models: [%s], pool: p%s}\n",
				model, model, model),
		}.String()
		if r := stream(ctx, tn.base, key1, model, 2); r.status != http.StatusNotFound {
			t.Fatalf("reload %d: model %s answered %d before its route exists", i, model, r.status)
		}
		if i%2 == 0 {
			// This reload replaces gpu-b, where the pool has sent streams
			// since the last one: make sure some are running on it.
			waitFor(t, 5*time.Second, "streams on gpu-b", func() bool { return tn.n.simRunning("gpu-b") > 0 })
		}
		before := tn.n.SimURL("gpu-b")
		busyB := tn.n.simRunning("gpu-b")
		inFlight := tn.n.handler.Snapshot().InFlight
		tn.write("sluice.yaml", cfg)
		code, res := tn.postReload()
		if code != http.StatusOK || res.Result != ResultOK {
			t.Fatalf("reload %d: %d %+v", i, code, res)
		}
		if after := tn.n.SimURL("gpu-b"); after != before {
			replaced = append(replaced, before)
			if busyB > 0 {
				busyReplaced++
			}
		}
		if inFlight > 0 {
			swapsUnderLoad++
		}
		if r := stream(ctx, tn.base, key1, model, 2); r.status != http.StatusOK || !r.done {
			t.Fatalf("reload %d: the new route's first request: %d done=%v %v", i, r.status, r.done, r.err)
		}
		// Let the load run on the new state before the next swap: a
		// round of streams ends after this reload.
		for len(ended) > 0 {
			<-ended
		}
		for range workers {
			select {
			case <-ended:
			case <-ctx.Done():
				t.Fatalf("reload %d: streams stopped ending", i)
			}
		}
	}
	close(stop)
	wg.Wait()

	if len(results) < workers*4 || len(replaced) < reloads/2-1 || busyReplaced < reloads/2 || swapsUnderLoad < reloads/2 {
		t.Fatalf("%d streams, %d simulator replacements (%d with streams on them), %d of %d swaps with streams in flight: the test did not exercise the reloads",
			len(results), len(replaced), busyReplaced, swapsUnderLoad, reloads)
	}
	for i, r := range results {
		if r.err != nil || r.status != http.StatusOK || !r.done {
			t.Errorf("stream %d broke across reloads: status %d, done %v, last %q, err %v", i, r.status, r.done, r.last, r.err)
		}
	}
	waitFor(t, 5*time.Second, "replaced simulators to stop", func() bool {
		for _, u := range replaced {
			if resp, err := http.Get(u + "/health"); err == nil {
				resp.Body.Close()
				return false
			}
		}
		return true
	})
	st, err := tn.n.limiter.Snapshot(context.Background(), "t1", limiter.Limits{MaxConcurrency: 100})
	if err != nil || st.InFlight != 0 {
		t.Fatalf("limiter in flight after the load: %d %v", st.InFlight, err)
	}
	t.Logf("%d streams across %d reloads (%d with streams in flight); %d simulator replacements, %d with streams on them",
		len(results), reloads, swapsUnderLoad, len(replaced), busyReplaced)
}

// Bad edits change nothing: the old config keeps serving, and the error,
// with its position, is answered, shown at /debug/config and counted.
func TestReloadInvalidEdit(t *testing.T) {
	good := nodeConfig{}.String()
	tn := startFileNode(t, good)
	version := tn.n.Config().Version
	cases := []struct {
		name, text, want string
	}{
		{"bad yaml", strings.Replace(good, "routes:\n", "routes:\n  - [\n", 1), tn.file + ":"},
		{"unknown key", strings.Replace(good, "pool: p}", "pool: p, modle: x}", 1), `unknown key "modle" in routes[0] (did you mean "models"?)`},
		{"missing pool", strings.Replace(good, "pool: p}", "pool: nope}", 1), `routes[0]: pool "nope" is not defined in pools`},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tn.write("sluice.yaml", c.text)
			code, res := tn.postReload()
			if code != http.StatusUnprocessableEntity || res.OK || res.Result != ResultInvalid || len(res.Errors) == 0 {
				t.Fatalf("reload: %d %+v", code, res)
			}
			if !strings.Contains(res.Errors[0], c.want) || !strings.HasPrefix(res.Errors[0], tn.file+":") {
				t.Fatalf("error %q; want file:line:col and %q", res.Errors[0], c.want)
			}
			cs := tn.debugConfig()
			if cs.Version != version || cs.LastAttempt == nil || cs.LastAttempt.Result != ResultInvalid ||
				cs.LastAttempt.Errors[0] != res.Errors[0] || cs.Failures != int64(i+1) {
				t.Fatalf("/debug/config: %+v", cs)
			}
			if r := stream(context.Background(), tn.base, key1, "sim-small", 3); r.status != 200 || !r.done {
				t.Fatalf("the old config stopped serving: %d", r.status)
			}
			if m := tn.get(tn.admin + "/metrics"); !strings.Contains(m, fmt.Sprintf("sluice_config_reload_errors_total %d\n", i+1)) ||
				!strings.Contains(m, "sluice_config_last_reload_successful 0\n") {
				t.Fatalf("metrics do not count the refused reload")
			}
		})
	}
	tn.write("sluice.yaml", strings.Replace(good, "models: [sim-small]", "models: [sim-small, other]", 1))
	if code, res := tn.postReload(); code != 200 || res.Result != ResultOK || res.Version == version {
		t.Fatalf("good edit after bad ones: %d %+v", code, res)
	}
	if !strings.Contains(tn.logs.String(), "config reload refused") {
		t.Fatal("refused reloads are not logged")
	}
}

// Listener addresses, the redis section and the node's name need a
// restart: such a reload is refused whole, naming the keys.
func TestReloadRestartRequired(t *testing.T) {
	good := nodeConfig{}.String()
	tn := startFileNode(t, good)
	version := tn.n.Config().Version
	edits := map[string]string{
		"listeners.http":  strings.Replace(good, "http: 127.0.0.1:0", "http: 127.0.0.1:1", 1),
		"listeners.admin": strings.Replace(good, "admin: 127.0.0.1:0", "admin: 127.0.0.2:0", 1),
		"redis.addrs":     good + "redis:\n  addrs: [\"127.0.0.1:1\"]\n",
		"node.name":       strings.Replace(good, "name: test,", "name: other,", 1),
	}
	for key, text := range edits {
		// Every edit also changes a route: nothing of it may apply.
		tn.write("sluice.yaml", strings.Replace(text, "models: [sim-small]", "models: [sim-small, x]", 1))
		code, res := tn.postReload()
		if code != http.StatusConflict || res.Result != ResultRestartRequired || res.OK {
			t.Fatalf("%s: %d %+v", key, code, res)
		}
		if !contains(res.RestartRequired, key) {
			t.Fatalf("%s: restart_required %v", key, res.RestartRequired)
		}
		if res.Version != version || tn.n.Config().Version != version {
			t.Fatalf("%s: the config changed", key)
		}
		if models := tn.n.handler.State().Routes.Models(""); len(models) != 1 {
			t.Fatalf("%s: half applied: models %v", key, models)
		}
	}
	if r := stream(context.Background(), tn.base, key1, "sim-small", 3); r.status != 200 || !r.done {
		t.Fatalf("the old config stopped serving: %d", r.status)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// A lowered limit applies to the next admission; a raised one too.
func TestReloadLoweredLimit(t *testing.T) {
	cfg := func(n int) string {
		return nodeConfig{Tenants: tenant("t1", fmt.Sprintf("max_concurrency: %d", n), key1)}.String()
	}
	tn := startFileNode(t, cfg(3))
	a := startStream(t, tn.base, key1, 400)
	b := startStream(t, tn.base, key1, 400)
	waitFor(t, 5*time.Second, "two streams", func() bool { return tn.n.handler.Snapshot().InFlight == 2 })

	tn.write("sluice.yaml", cfg(1))
	if code, res := tn.postReload(); code != 200 {
		t.Fatalf("reload: %+v", res)
	}
	r := stream(context.Background(), tn.base, key1, "sim-small", 2)
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" {
		t.Fatalf("after lowering max_concurrency to 1 with 2 streams running: %d; want 429", r.status)
	}
	tn.write("sluice.yaml", cfg(5))
	tn.postReload()
	if r := stream(context.Background(), tn.base, key1, "sim-small", 2); r.status != 200 || !r.done {
		t.Fatalf("after raising the limit: %d", r.status)
	}
	for _, ch := range []<-chan streamResult{a, b} {
		if r := <-ch; !r.done {
			t.Fatalf("a stream admitted before the change broke: %d %q", r.status, r.last)
		}
	}
}

// A tenants file reloads on its own: a revoked key fails from the next
// request on, without touching routes; a broken tenants file changes
// nothing and is reported with its own file:line:col.
func TestTenantsFileRevocation(t *testing.T) {
	both := tenant("t1", "max_concurrency: 10", key1) + tenant("t2", "", key2)
	cfg := nodeConfig{TenantsRaw: "tenants_file: tenants.yaml\n"}.String()
	tn := startFileNode(t, cfg, "tenants.yaml", both)
	routes := tn.n.handler.State().Routes
	for _, k := range []string{key1, key2} {
		if r := stream(context.Background(), tn.base, k, "sim-small", 2); r.status != 200 {
			t.Fatalf("key %s: %d", k, r.status)
		}
	}
	// Revoked through the reload function: effective on the next request.
	tn.write("tenants.yaml", tenant("t1", "max_concurrency: 10", key1))
	if res := tn.n.ReloadTenants(TriggerTenants); res.Result != ResultOK {
		t.Fatalf("tenants reload: %+v", res)
	}
	if r := stream(context.Background(), tn.base, key2, "sim-small", 2); r.status != http.StatusUnauthorized {
		t.Fatalf("revoked key: %d; want 401", r.status)
	}
	if tn.n.handler.State().Routes != routes {
		t.Fatal("a tenants reload rebuilt the routes")
	}

	// Through the file watcher.
	attempts := tn.attempts()
	if err := tn.n.WatchConfig(); err != nil {
		t.Fatal(err)
	}
	tn.write("tenants.yaml", tenant("t2", "", key2))
	waitAttempt(t, attempts, "the watcher to reload the tenants", func(r Result) bool {
		return r.Trigger == TriggerTenants && r.Result == ResultOK
	})
	if r := stream(context.Background(), tn.base, key1, "sim-small", 1); r.status != http.StatusUnauthorized {
		t.Fatalf("key1 after the watcher's reload: %d; want 401", r.status)
	}
	if r := stream(context.Background(), tn.base, key2, "sim-small", 2); r.status != 200 {
		t.Fatalf("key2 after the watcher's reload: %d", r.status)
	}

	tn.write("tenants.yaml", tenant("t2", "", key2)+"  - id: t3\n    keys: [sk-live-plaintext]\n")
	waitAttempt(t, attempts, "the broken tenants file to be reported", func(r Result) bool { return r.Result == ResultInvalid })
	cs := tn.debugConfig()
	want := filepath.Join(tn.dir, "tenants.yaml") + ":5:12: tenant \"t3\": key must be a hash"
	if !strings.HasPrefix(cs.LastAttempt.Errors[0], want) || cs.TenantsFile == nil || cs.TenantsFile.Tenants != 1 {
		t.Fatalf("/debug/config: %+v; want error %q", cs, want)
	}
	if r := stream(context.Background(), tn.base, key2, "sim-small", 2); r.status != 200 {
		t.Fatalf("key2 after a broken tenants edit: %d", r.status)
	}
	// The active file's tenants, written out again (redacted, no comments).
	got := tn.get(tn.admin + "/debug/config?format=tenants")
	if ts, err := configs.ParseTenants("shown.yaml", []byte(got)); err != nil || len(ts.Tenants) != 1 ||
		ts.Tenants[0].ID != "t2" || !slices.Equal(ts.Tenants[0].Keys, []string{proxy.HashKey(key2)}) {
		t.Fatalf("?format=tenants: %q (%v)", got, err)
	}
}

// The watcher sees an editor's atomic rename and an in-place write.
// (SIGHUP: cmd/sluice's TestSignals.)
func TestReloadTriggers(t *testing.T) {
	good := nodeConfig{}.String()
	tn := startFileNode(t, good)
	attempts := tn.attempts()
	if err := tn.n.WatchConfig(); err != nil {
		t.Fatal(err)
	}
	waitVersion := func(what, text string) {
		t.Helper()
		want := configsVersion(text)
		waitAttempt(t, attempts, what, func(r Result) bool { return r.Version == want })
		if v := tn.debugConfig().Version; v != want {
			t.Fatalf("%s: /debug/config shows version %s; want %s", what, v, want)
		}
	}
	v1 := strings.Replace(good, "models: [sim-small]", "models: [sim-small, a]", 1)
	tn.write("sluice.yaml", v1)
	waitVersion("the watcher to load a renamed-over file", v1)

	v2 := strings.Replace(good, "models: [sim-small]", "models: [sim-small, b]", 1)
	if err := os.WriteFile(tn.file, []byte(v2), 0o600); err != nil {
		t.Fatal(err)
	}
	waitVersion("the watcher to load a file written in place", v2)
	if got := tn.n.handler.State().Routes.Models(""); len(got) != 2 || got[1] != "b" {
		t.Fatalf("models %v", got)
	}

}

// /debug/config?format=yaml shows the active text without secrets.
func TestDebugConfigYAML(t *testing.T) {
	cfg := nodeConfig{Pools: "  - name: p\n    api_key: backend-secret-123\n    backends: [{url: \"sim://gpu-a\"}]\n"}.String()
	tn := startFileNode(t, cfg)
	got := tn.get(tn.admin + "/debug/config?format=yaml")
	if strings.Contains(got, "backend-secret-123") || !strings.Contains(got, "api_key: <redacted>") {
		t.Fatalf("?format=yaml:\n%s", got)
	}
	cs := tn.debugConfig()
	if cs.File != tn.file || len(cs.Version) != 12 || cs.LoadedAt.IsZero() || cs.LastAttempt != nil || cs.Tenants != 1 {
		t.Fatalf("/debug/config: %+v", cs)
	}
}

// A reload keeps what it does not change: the pools (with their health
// and load) and the simulators; a change of a simulator's settings
// restarts that one only. A comment-only edit changes nothing but the
// version shown.
func TestReloadKeepsUnchanged(t *testing.T) {
	pools := "  - {name: p, backends: [{url: \"sim://gpu-a\"}]}\n  - {name: q, backends: [{url: \"sim://gpu-b\"}]}\n"
	routes := "  - {name: main, path: /v1/, models: [sim-small], pool: p}\n  - {name: other, host: other.test, path: /v1/, pool: q}\n"
	base := nodeConfig{Pools: pools, Routes: routes}
	tn := startFileNode(t, base.String())
	poolsBefore := map[string]any{"p": tn.n.pool("p"), "q": tn.n.pool("q")}
	simA, simB := tn.n.SimURL("gpu-a"), tn.n.SimURL("gpu-b")

	next := base
	next.Tenants = tenant("t1", "max_concurrency: 7", key1)
	tn.write("sluice.yaml", next.String())
	if code, res := tn.postReload(); code != 200 || res.Result != ResultOK || len(res.Changes) != 1 {
		t.Fatalf("limit change: %d %+v", code, res)
	}
	if tn.n.pool("p") != poolsBefore["p"] || tn.n.pool("q") != poolsBefore["q"] || tn.n.SimURL("gpu-a") != simA || tn.n.SimURL("gpu-b") != simB {
		t.Fatal("a tenant limit change rebuilt pools or restarted simulators")
	}

	next.Sims = testSim("gpu-a", "sim-small", 1) + testSim("gpu-b", "sim-small", 99)
	tn.write("sluice.yaml", next.String())
	if code, res := tn.postReload(); code != 200 || res.Result != ResultOK {
		t.Fatalf("simulator change: %d %+v", code, res)
	}
	if tn.n.SimURL("gpu-a") != simA || tn.n.SimURL("gpu-b") == simB {
		t.Fatal("want gpu-b restarted, gpu-a kept")
	}
	if tn.n.pool("p") != poolsBefore["p"] || tn.n.pool("q") == poolsBefore["q"] {
		t.Fatal("want pool q (on the restarted simulator) rebuilt, p kept")
	}

	version := tn.n.Config().Version
	tn.write("sluice.yaml", "# a comment\n"+next.String())
	code, res := tn.postReload()
	if code != 200 || res.Result != ResultUnchanged || res.Version == version || tn.debugConfig().Version != res.Version {
		t.Fatalf("comment-only edit: %d %+v", code, res)
	}
}

// Replaced pools stop their scrapers and probes: after many reloads the
// node runs as many goroutines as before.
func TestReloadStopsReplacedPools(t *testing.T) {
	tn := startFileNode(t, nodeConfig{}.String())
	// Counted by kind, not in total: the live pool's probe and scrape
	// connections and the test's own keep-alive connection to the admin
	// listener come and go with timing, a replaced pool's goroutines must
	// not stay.
	count := func() (loops, conns int) {
		buf := make([]byte, 4<<20)
		all := string(buf[:runtime.Stack(buf, true)])
		return strings.Count(all, "routing.(*Pool).scrapeLoop(") + strings.Count(all, "routing.(*Pool).probeLoop("),
			strings.Count(all, "net/http.(*persistConn).readLoop(")
	}
	// The config's one backend has a scraper and a prober.
	waitFor(t, 5*time.Second, "the first pool's scraper and prober", func() bool { loops, _ := count(); return loops == 2 })
	loopsBefore, connsBefore := count()
	for i := 1; i <= 12; i++ {
		backend := []string{"gpu-a", "gpu-b"}[i%2]
		tn.write("sluice.yaml", nodeConfig{Pools: fmt.Sprintf("  - {name: p, backends: [{url: \"sim://%s\"}]}\n", backend)}.String())
		if code, res := tn.postReload(); code != 200 || res.Result != ResultOK {
			t.Fatalf("reload %d: %d %+v", i, code, res)
		}
	}
	// At most the live pool's scrape and probe connections and the admin
	// connection are new; 12 replaced pools leaking theirs would be 24.
	waitFor(t, 5*time.Second, "replaced pools' goroutines and connections to end", func() bool {
		loops, conns := count()
		return loops == loopsBefore && conns <= connsBefore+3
	})
}
