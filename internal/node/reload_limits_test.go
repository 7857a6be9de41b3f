package node

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/configs"
)

// bombTenants is a billion-laughs tenants section (~1.5 KB): each
// tenant's models map names the previous tenant's limits ten times, so
// nine levels stand for 10^9 values once aliases are expanded.
func bombTenants() string {
	var b strings.Builder
	b.WriteString(tenant("t1", "max_concurrency: 100", key1))
	b.WriteString("  - id: b0\n    limits: &l0 {max_concurrency: 1}\n")
	for i := 1; i <= 9; i++ {
		d := string(rune('0' + i))
		b.WriteString("  - id: b" + d + "\n    limits: &l" + d + "\n      models:\n")
		for j := 0; j < 10; j++ {
			b.WriteString("        m" + string(rune('0'+j)) + ": *l" + string(rune('0'+i-1)) + "\n")
		}
	}
	return b.String()
}

// memDelta reports what running f allocated in all (TotalAlloc) and by
// how much the live heap after a GC grew.
func memDelta(f func()) (alloc, heap int64) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.GC()
	runtime.ReadMemStats(&after)
	return int64(after.TotalAlloc - before.TotalAlloc), int64(after.HeapAlloc) - int64(before.HeapAlloc)
}

// TestAttackReloadConfigBombs: a live node whose config file is replaced
// by a hostile one (an alias bomb, 20,000 levels of block nesting, a
// 256 MiB file, 4 MB of tiny values, a tenants file holding an alias bomb) refuses each reload
// whole, by the file watcher and by POST /-/reload: the old config keeps
// serving and the node allocates under 64 MiB per refusal. Fails on the
// old code: the 256 MiB file was read whole (513 MB allocated), the
// million values took the parser ~9 s and 1.3 GB, and the other refusals
// came later, from the decoder, with other messages.
func TestAttackReloadConfigBombs(t *testing.T) {
	good := nodeConfig{}.String()
	tn := startFileNode(t, good)
	version := tn.n.Config().Version
	attempts := tn.attempts()
	if err := tn.n.WatchConfig(); err != nil {
		t.Fatal(err)
	}
	sparse := func(name string, size int64) func() {
		return func() {
			tmp := filepath.Join(tn.dir, "."+name+".sparse")
			f, err := os.Create(tmp)
			if err != nil {
				t.Fatal(err)
			}
			f.WriteString(good) // a valid start, then NUL bytes that take no disk
			if err := f.Truncate(size); err != nil {
				t.Fatal(err)
			}
			f.Close()
			if err := os.Rename(tmp, filepath.Join(tn.dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	million := good + "x:\n" + strings.Repeat("- 1\n", 1_000_000) // built outside the measurements
	cases := []struct {
		name  string
		write func()
		want  string
	}{
		{"alias bomb", func() { tn.write("sluice.yaml", nodeConfig{TenantsRaw: "tenants:\n" + bombTenants()}.String()) },
			"once aliases are expanded"},
		{"block nesting", func() { tn.write("sluice.yaml", good+"x:\n  "+strings.Repeat("- ", 20_000)+"x\n") },
			"block collections nested deeper than 64"},
		{"256 MiB file", sparse("sluice.yaml", 256<<20), "the limit is 4194304"},
		{"a million values", func() { tn.write("sluice.yaml", million) },
			"counted before parsing"},
		{"tenants file bomb", func() {
			tn.write("tenants.yaml", "tenants:\n"+bombTenants())
			tn.write("sluice.yaml", nodeConfig{TenantsRaw: "tenants_file: tenants.yaml\n"}.String())
		}, "once aliases are expanded"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var watched Result
			alloc, heap := memDelta(func() {
				c.write()
				watched = waitAttempt(t, attempts, "the watcher's attempt", func(r Result) bool { return r.Trigger != TriggerAPI })
			})
			if watched.Result != ResultInvalid || watched.Version != version || len(watched.Errors) == 0 ||
				!strings.Contains(strings.Join(watched.Errors, "\n"), c.want) {
				t.Fatalf("watcher: %+v; want invalid, version kept, an error %q", watched, c.want)
			}
			var code int
			var res Result
			apiAlloc, apiHeap := memDelta(func() { code, res = tn.postReload() })
			if code != http.StatusUnprocessableEntity || res.Result != ResultInvalid || res.Version != version ||
				!strings.Contains(strings.Join(res.Errors, "\n"), c.want) {
				t.Fatalf("POST /-/reload: %d %+v; want 422 invalid with %q", code, res, c.want)
			}
			const bound = 64 << 20
			if alloc > bound || heap > bound || apiAlloc > bound || apiHeap > bound {
				t.Errorf("refusing allocated %d MB (heap %+d MB) on the file event, %d MB (heap %+d MB) on the API; want under 64 MB",
					alloc>>20, heap>>20, apiAlloc>>20, apiHeap>>20)
			}
			t.Logf("allocated %d KB / %d KB; %.120s", alloc>>10, apiAlloc>>10, res.Errors[0])
			if v := tn.n.Config().Version; v != version {
				t.Fatalf("active version %s; want the old %s", v, version)
			}
			if r := stream(context.Background(), tn.base, key1, "sim-small", 3); r.status != 200 || !r.done {
				t.Fatalf("the old config stopped serving: %d", r.status)
			}
		})
	}
	tn.write("sluice.yaml", good)
	if code, res := tn.postReload(); code != http.StatusOK || !res.OK {
		t.Fatalf("the good file again: %d %+v", code, res)
	}
	if _, err := configs.Load(tn.file); err != nil {
		t.Fatal(err)
	}
}
