package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"testing"
	"time"
)

// writeFiles creates files (path relative to root → content) under root.
func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCgroupMemoryLimit reads the container's memory limit from cgroup v2
// and v1 layouts as the kernel writes them, and finds none where the
// kernel says "no limit".
func TestCgroupMemoryLimit(t *testing.T) {
	cases := []struct {
		name  string
		files map[string]string
		want  int64
		file  string
	}{
		{"v2 own cgroup", map[string]string{
			"proc/self/cgroup":                          "0::/kubepods/pod1/c1\n",
			"sys/fs/cgroup/kubepods/pod1/c1/memory.max": "536870912\n",
			"sys/fs/cgroup/memory.max":                  "max\n",
		}, 512 << 20, "/sys/fs/cgroup/kubepods/pod1/c1/memory.max"},
		{"v2 namespaced root", map[string]string{
			"proc/self/cgroup":         "0::/\n",
			"sys/fs/cgroup/memory.max": "1073741824\n",
		}, 1 << 30, "/sys/fs/cgroup/memory.max"},
		{"v2 no limit", map[string]string{
			"proc/self/cgroup":         "0::/\n",
			"sys/fs/cgroup/memory.max": "max\n",
		}, 0, ""},
		{"v1 memory controller", map[string]string{
			"proc/self/cgroup": "9:pids:/\n4:memory:/docker/abc\n0::/\n",
			"sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "268435456\n",
		}, 256 << 20, "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes"},
		{"v1 unlimited", map[string]string{
			"proc/self/cgroup": "4:memory:/process_api/x\n0::/\n",
			"sys/fs/cgroup/memory/process_api/x/memory.limit_in_bytes": "9223372036854771712\n",
		}, 0, ""},
		{"nothing mounted", map[string]string{"proc/self/cgroup": "0::/\n"}, 0, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			writeFiles(t, root, tc.files)
			got, file := cgroupMemoryLimit(root)
			if got != tc.want || file != tc.file {
				t.Fatalf("cgroupMemoryLimit = %d, %q; want %d, %q", got, file, tc.want, tc.file)
			}
		})
	}
}

// TestRuntimeDefaultsGOGC: with GOGC unset and a memory limit in force
// Sluice sets the collector's target to limitedGOGC and logs it as its
// own; with no limit it leaves Go's 100; with GOGC set it leaves the
// runtime's value (read from the environment at start) alone and logs the
// environment's. GOMEMLIMIT in the environment keeps applyRuntimeDefaults
// from reading the test machine's cgroup; the limit itself is set (and
// restored) by the test.
func TestRuntimeDefaultsGOGC(t *testing.T) {
	cases := []struct {
		name, env, wantLog, wantSource string
		limit                          int64
		wantPercent                    int
	}{
		{"unset, limit", "", strconv.Itoa(limitedGOGC), "sluice", 1 << 30, limitedGOGC},
		{"unset, no limit, tuner off", "", "100", "go", math.MaxInt64, 100}, // SLUICE_GC_HEADROOM=0
		{"set, limit", "150", "150", "GOGC", 1 << 30, 100},                  // the runtime read GOGC at start; 100 is what the test set
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GOGC", tc.env)
			t.Setenv("GOMEMLIMIT", "test")
			t.Setenv("SLUICE_GC_HEADROOM", "0")
			prev := debug.SetGCPercent(100)
			prevLimit := debug.SetMemoryLimit(tc.limit)
			t.Cleanup(func() { debug.SetGCPercent(prev); debug.SetMemoryLimit(prevLimit) })
			var buf bytes.Buffer
			applyRuntimeDefaults(slog.New(slog.NewJSONHandler(&buf, nil)))
			if got := debug.SetGCPercent(100); got != tc.wantPercent {
				t.Errorf("GC percent = %d, want %d", got, tc.wantPercent)
			}
			var m map[string]any
			if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
				t.Fatalf("log line %q: %v", buf.String(), err)
			}
			if m["msg"] != "go runtime" || m["gogc"] != tc.wantLog || m["gogc_source"] != tc.wantSource ||
				m["memory_limit_source"] != "GOMEMLIMIT" {
				t.Fatalf("log line %q: want gogc %q from %q", buf.String(), tc.wantLog, tc.wantSource)
			}
			if _, ok := m["memory_limit_bytes"]; ok != (tc.limit < math.MaxInt64) {
				t.Fatalf("log line %q: memory_limit_bytes present %v with limit %d", buf.String(), ok, tc.limit)
			}
		})
	}
}

// TestGCPercentFor: Go's 100 for a live heap of headroom or more, raised so
// that headroom bytes fit between collections below it, capped.
func TestGCPercentFor(t *testing.T) {
	const h = 16 << 20
	for _, tc := range []struct {
		live uint64
		want int
	}{
		{0, gcMaxPercent}, {1 << 20, gcMaxPercent}, {4 << 20, 400}, {5 << 20, 320}, {8 << 20, 200},
		{10 << 20, 160}, {16 << 20, 100}, {100 << 20, 100},
	} {
		if got := gcPercentFor(tc.live, h); got != tc.want {
			t.Errorf("gcPercentFor(%d MiB) = %d, want %d", tc.live>>20, got, tc.want)
		}
	}
}

// TestGCTuner: with neither GOGC nor a memory limit, applyRuntimeDefaults
// starts the tuner — by default with defaultGCHeadroom, with
// SLUICE_GC_HEADROOM's bytes when set (a bad value is logged and the
// default used) — which sets the collector's target from the live heap
// after a collection (a test binary's few MiB under a 64 MiB headroom:
// the cap), and logs it.
func TestGCTuner(t *testing.T) {
	for _, tc := range []struct {
		name, env, bad string
		want           float64
	}{
		{"default", "", "", defaultGCHeadroom},
		{"bad value", "16MiB", "16MiB", defaultGCHeadroom},
		{"set", strconv.Itoa(64 << 20), "", 64 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GOGC", "")
			t.Setenv("GOMEMLIMIT", "test")
			t.Setenv("SLUICE_GC_HEADROOM", tc.env)
			prev := debug.SetGCPercent(100)
			prevLimit := debug.SetMemoryLimit(math.MaxInt64)
			var buf bytes.Buffer
			applyRuntimeDefaults(slog.New(slog.NewJSONHandler(&buf, nil)))
			t.Cleanup(func() { stopGCTuner(); runtime.GC(); debug.SetGCPercent(prev); debug.SetMemoryLimit(prevLimit) })
			var m map[string]any
			if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
				t.Fatalf("log line %q: %v", buf.String(), err)
			}
			if m["gogc"] != "100+headroom" || m["gogc_source"] != "sluice" || m["gc_headroom_bytes"] != tc.want {
				t.Fatalf("log line %q: want gc_headroom_bytes %v", buf.String(), tc.want)
			}
			if bad, _ := m["gc_headroom_invalid"].(string); bad != tc.bad {
				t.Fatalf("log line %q: gc_headroom_invalid %q, want %q", buf.String(), bad, tc.bad)
			}
			if want := map[bool]string{false: "INFO", true: "WARN"}[tc.bad != ""]; m["level"] != want {
				t.Fatalf("log line %q: level %v, want %s", buf.String(), m["level"], want)
			}
		})
	}
	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "test")
	t.Setenv("SLUICE_GC_HEADROOM", strconv.Itoa(64<<20))
	prev := debug.SetGCPercent(100)
	prevLimit := debug.SetMemoryLimit(math.MaxInt64)
	applyRuntimeDefaults(slog.New(slog.DiscardHandler))
	t.Cleanup(func() { stopGCTuner(); runtime.GC(); debug.SetGCPercent(prev); debug.SetMemoryLimit(prevLimit) })
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	for i := 0; ; i++ {
		runtime.GC()
		time.Sleep(10 * time.Millisecond) // the finalizer goroutine's turn
		metrics.Read(s)
		if s[0].Value.Uint64() == gcMaxPercent {
			break
		}
		if i == 100 {
			t.Fatalf("GC percent %d after %d collections, want %d", s[0].Value.Uint64(), i+1, gcMaxPercent)
		}
	}
}

// TestGCTunerStops: once stopGCTuner returns (applyRuntimeDefaults calls it
// first, so a second serve in one process replaces the first's tuner), no
// collection sets the target again; a tuner started over a running one
// replaces it.
func TestGCTunerStops(t *testing.T) {
	prev := debug.SetGCPercent(100)
	t.Cleanup(func() { stopGCTuner(); runtime.GC(); debug.SetGCPercent(prev) })
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	percentAfterGCs := func() uint64 {
		for range 3 {
			runtime.GC()
			time.Sleep(10 * time.Millisecond) // the finalizer goroutine's turn
		}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	startGCTuner(64 << 20)
	first := tuner.t
	startGCTuner(64 << 20)
	if tuner.t == first {
		t.Fatal("a second startGCTuner kept the first tuner")
	}
	first.mu.Lock()
	stopped := first.stopped
	first.mu.Unlock()
	if !stopped {
		t.Fatal("the replaced tuner still runs")
	}
	if got := percentAfterGCs(); got != gcMaxPercent {
		t.Fatalf("GC percent %d with the tuner running, want %d", got, gcMaxPercent)
	}
	stopGCTuner()
	debug.SetGCPercent(100)
	if got := percentAfterGCs(); got != 100 {
		t.Fatalf("GC percent %d after stopGCTuner and three collections, want 100", got)
	}
}
