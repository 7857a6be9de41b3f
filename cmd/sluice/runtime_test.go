package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"testing"
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
		{"unset, no limit", "", "100", "go", math.MaxInt64, 100},
		{"set, limit", "150", "150", "GOGC", 1 << 30, 100}, // the runtime read GOGC at start; 100 is what the test set
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GOGC", tc.env)
			t.Setenv("GOMEMLIMIT", "test")
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
