package benchsuite

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// rowOf finds the row of target num whose figure contains part.
func rowOf(t *testing.T, rows []Row, num, part string) Row {
	t.Helper()
	for _, r := range rows {
		if r.Target == num && strings.Contains(r.Figure, part) {
			return r
		}
	}
	t.Fatalf("no row %s %q in %+v", num, part, rows)
	return Row{}
}

func TestRowsFromFixture(t *testing.T) {
	s, err := Load("testdata")
	if err != nil {
		t.Fatal(err)
	}
	rows := s.Rows()

	// Issue 22: the added per-token delays no worse than before (+0.12 /
	// +0.33 ms).
	p50 := rowOf(t, rows, "1", "delay P50")
	if p50.Cells["sluice"] != "+0.150" || p50.Cells["nginx"] != "+0.200" || p50.Direct != "0.100" || p50.Result != Miss || p50.Key != "delay-p50" {
		t.Errorf("t1 P50 row = %+v, want a miss (+0.150 > +0.12)", p50)
	}
	if p99 := rowOf(t, rows, "1", "delay P99"); p99.Cells["sluice"] != "+1.200" || p99.Result != Miss {
		t.Errorf("t1 P99 row = %+v, want +1.200 and a miss (> 0.33)", p99)
	}
	// nginx's CPU is the sum over its master and workers; the goal is ≤ 1.0× nginx.
	if c := rowOf(t, rows, "1", "CPU"); c.Cells["sluice"] != "25.0" || c.Cells["nginx"] != "30.0" || c.VsNginx != "×0.83" || c.Result != Pass {
		t.Errorf("t1 CPU row = %+v", c)
	}
	// Added TTFT P50 ≤ nginx's: +1.5 against +1.1 ms.
	if tt := rowOf(t, rows, "1", "TTFT P50"); tt.Cells["sluice"] != "+1.500" || tt.Cells["nginx"] != "+1.100" || tt.Direct != "1.500" ||
		tt.VsNginx != "+0.400 ms" || tt.Result != Miss {
		t.Errorf("t1 TTFT P50 row = %+v", tt)
	}
	if tt := rowOf(t, rows, "1", "TTFT P99"); tt.Cells["sluice"] != "+5.000" || tt.Result != ReportOnly {
		t.Errorf("t1 TTFT P99 row = %+v", tt)
	}
	// 1r: the price of a reconnect, apart from every proxy's counts.
	if rc := rowOf(t, rows, "1r", "TTFT P50"); rc.Cells["sluice"] != "+0.500" || rc.Direct != "0.400" || rc.Result != ReportOnly {
		t.Errorf("1r row = %+v", rc)
	}
	// h2 CPU per token ÷ h1's: 31 / 25 > 1.2.
	if h2 := rowOf(t, rows, "2", "h2 CPU per token ÷ h1"); h2.Cells["sluice"] != "1.24" || h2.Result != Miss {
		t.Errorf("h2 ÷ h1 row = %+v", h2)
	}
	// 5b: sparse P99 ≤ nginx's + 0.2 ms: +0.95 against +0.70.
	if sp := rowOf(t, rows, "5b", "P99"); sp.VsNginx != "+0.250 ms" || sp.Result != Miss {
		t.Errorf("5b P99 row = %+v", sp)
	}
	if _, ok := rowOrNil(rows, "1", "caddy"); ok {
		t.Error("a row mentions Caddy, which did not run")
	}

	rps := rowOf(t, rows, "3", "requests/s")
	if rps.Ratio != "0.90" || rps.Result != Pass || rps.Cells["sluice"] != "900 (×0.90)" {
		t.Errorf("t3 rps row = %+v", rps)
	}
	// 100 ms over 4000 requests = 25 µs; nginx 60 ms over 6000 = 10 µs: 2.5× > 2×.
	if us := rowOf(t, rows, "3", "per request"); us.Cells["sluice"] != "25.0" || us.Cells["nginx"] != "10.0" || us.VsNginx != "×2.50" || us.Result != Miss {
		t.Errorf("t3 CPU row = %+v", us)
	}

	// 200,000 KiB over 10,000 streams = 20 KiB; nginx 97,440 over 9,744 = 10 KiB.
	if mem := rowOf(t, rows, "4", "RSS"); mem.Cells["sluice"] != "20.0" || mem.Cells["nginx"] != "10.0" || mem.VsNginx != "×2.00" || mem.Result != Miss {
		t.Errorf("t4 RSS row = %+v", mem)
	}
	if held := rowOf(t, rows, "4", "held"); held.Cells["sluice"] != "10000 / 10000 (0)" || held.Result != Pass || !strings.Contains(held.Figure, "h2c") {
		t.Errorf("t4 held row = %+v", held)
	}

	// Truncations: the target side of every run; the direct side apart.
	if tr := rowOf(t, rows, "5c", "truncated"); tr.Cells["sluice"] != "1 (of 17800)" || tr.Direct != "2" || tr.Result != Miss {
		t.Errorf("5c row = %+v", tr)
	}

	// Issue 22's table: every goal in the issue's order; h3 did not run.
	goals := s.Issue22(rows)
	if len(goals) != len(Issue22Goals) {
		t.Fatalf("issue-22 table has %d rows, want %d", len(goals), len(Issue22Goals))
	}
	want := map[string]string{"cpu-h1": Pass, "rss": Miss, "sparse-p99": Miss, "delay-p50": Miss, "delay-p99": Miss,
		"ttft-p50": Miss, "cpu-h2-h1": Miss, "cpu-h3-h1": "not run", "small-cpu": Miss, "small-rps": Pass, "truncated": Miss}
	for i, g := range goals {
		if g.Key != Issue22Goals[i].Key || g.Result != want[g.Key] {
			t.Errorf("issue-22 row %d = %+v, want key %s result %s", i, g, Issue22Goals[i].Key, want[Issue22Goals[i].Key])
		}
	}

	q := rowOf(t, rows, "6", "with edge queue")
	// 2100 ms ≤ knee 120 ms + 2000 ms, and 33 ≥ 0.9 × 34 req/s.
	if q.Result != Pass || q.Cells["sluice"] != "33.0; 2100; 220" {
		t.Errorf("t6 queue row = %+v", q)
	}
	if plain := rowOf(t, rows, "6", "no edge queue"); !strings.Contains(plain.Figure, "knee at rate 30") {
		t.Errorf("t6 plain row = %+v", plain)
	}
}

func rowOrNil(rows []Row, num, cellKey string) (Row, bool) {
	for _, r := range rows {
		if r.Target == num && r.Cells[cellKey] != "" {
			return r, true
		}
	}
	return Row{}, false
}

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "raw"), 0o755); err != nil {
		t.Fatal(err)
	}
	names, _ := filepath.Glob("testdata/raw/*.json")
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "raw", filepath.Base(n)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A run that died mid-way leaves an empty file: the table is still
	// written and the error names the file.
	if err := os.WriteFile(filepath.Join(dir, "raw", "t5-redis.json"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := WriteFile(dir)
	if err == nil || !strings.Contains(err.Error(), "t5-redis.json") {
		t.Errorf("WriteFile error = %v, want one naming t5-redis.json", err)
	}
	b, rerr := os.ReadFile(filepath.Join(dir, "results.md"))
	if rerr != nil {
		t.Fatal(rerr)
	}
	md := string(b)
	for _, want := range []string{
		"| target | figure | Sluice | nginx | Caddy | direct | ratio | goal | result |",
		"| 1 | h1 added per-token delay P99 (ms) | +1.200 | +0.200 | — | 0.800 | 2.500 | ≤ +0.33 (before issue 22) | **miss** |",
		"| added TTFT P50 at 64 streams (target 1) | 1 | +1.500 | +1.100 | — | +0.400 ms | ≤ nginx's | **miss** |",
		"| h3 CPU per token ÷ h1 | 1,2 | — | — | — | — | ≤ 1.2 | not run |",
		"2 × AMD EPYC", "QUICK=1", "Caddy not run",
		"## t6-sweep-queue", "| 60 | 33.0 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("results.md lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "| 5 |") {
		t.Error("results.md has a target 5 row from an empty file")
	}
}

func TestLoadEmptyDir(t *testing.T) {
	if _, err := Load(t.TempDir()); err == nil {
		t.Error("Load of a directory without raw/*.json succeeded")
	}
}
