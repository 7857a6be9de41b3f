// Package benchsuite turns the raw output of docs/benchmarks/run.sh (the
// JSON reports of `sluice bench` and the script's own idle-stream records)
// into the results table of docs/BENCHMARKS.md: one row per figure, with
// Sluice, the nginx and Caddy references, the direct connection to the
// simulator, the ratio and whether the target is met.
package benchsuite

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sluice-proxy/sluice/internal/loadgen"
)

// Proxies are the proxies of the suite, Sluice first.
var Proxies = []string{"sluice", "nginx", "caddy"}

// pct is a latency distribution as `sluice bench -json` writes it.
type pct struct {
	N     int     `json:"n"`
	P50ms float64 `json:"p50_ms"`
	P95ms float64 `json:"p95_ms"`
	P99ms float64 `json:"p99_ms"`
	MaxMs float64 `json:"max_ms"`
}

type counts struct {
	Sent         int `json:"sent"`
	OK           int `json:"ok"`
	Status429    int `json:"status_429"`
	Status4xx    int `json:"status_4xx"`
	Status5xx    int `json:"status_5xx"`
	Errors       int `json:"errors"`
	StreamErrors int `json:"stream_errors"`
	Truncated    int `json:"truncated"`
	Canceled     int `json:"canceled"`
}

// failed counts the outcomes that are neither OK nor a deliberate 429/503.
func (c counts) failed() int { return c.Errors + c.StreamErrors + c.Truncated + c.Status4xx }

type cpu struct {
	PID           int     `json:"pid"`
	CPUMs         float64 `json:"cpu_ms"`
	MsPer1kTokens float64 `json:"ms_per_1k_tokens"`
	Err           string  `json:"error"`
}

type target struct {
	Role           string  `json:"role"`
	URL            string  `json:"url"`
	Protocol       string  `json:"protocol"`
	Counts         counts  `json:"counts"`
	RequestsPerSec float64 `json:"requests_per_s"`
	OutputTokens   int64   `json:"output_tokens"`
	TTFT           pct     `json:"ttft"`
	ITL            pct     `json:"itl"`
	TokenDelay     pct     `json:"token_delay"`
	CPU            []cpu   `json:"cpu"`
	GeneratorCPU   cpu     `json:"generator_cpu"`
}

// cpuMs is the CPU time of all the proxy's processes.
func (t target) cpuMs() float64 {
	var s float64
	for _, c := range t.CPU {
		s += c.CPUMs
	}
	return s
}

// cpuPer1k is the proxy's CPU time per 1,000 output tokens.
func (t target) cpuPer1k() float64 {
	var s float64
	for _, c := range t.CPU {
		s += c.MsPer1kTokens
	}
	return s
}

// compareRow is what `sluice bench -compare` writes for one percentile.
type compareRow = loadgen.CompareRow

// Report is one `sluice bench -json` report (a single run or -compare).
type Report struct {
	Targets    []target `json:"targets"`
	Comparison *struct {
		Rows []compareRow `json:"rows"`
	} `json:"comparison"`
}

func (r *Report) row(metric, stat string) (compareRow, bool) {
	if r == nil || r.Comparison == nil {
		return compareRow{}, false
	}
	for _, x := range r.Comparison.Rows {
		if x.Metric == metric && x.Stat == stat {
			return x, true
		}
	}
	return compareRow{}, false
}

func (r *Report) side(i int) (target, bool) {
	if r == nil || i >= len(r.Targets) {
		return target{}, false
	}
	return r.Targets[i], true
}

// Point is one load level of a sweep.
type Point struct {
	Kind           string  `json:"kind"`
	Value          float64 `json:"value"`
	RequestsPerSec float64 `json:"requests_per_s"`
	TTFT           pct     `json:"ttft"`
	ITL            pct     `json:"itl"`
	Counts         counts  `json:"counts"`
	Knee           bool    `json:"knee"`
}

// Sweep is a `sluice bench -sweep -json` report.
type Sweep struct {
	Points []Point `json:"points"`
}

// Idle is the script's record of one idle-stream run (target 4).
type Idle struct {
	Proxy        string `json:"proxy"`
	Streams      int    `json:"streams"`
	Held         int    `json:"held"`
	RSSBeforeKiB int64  `json:"rss_before_kib"`
	RSSHoldKiB   int64  `json:"rss_hold_kib"`
	UpstreamH2C  bool   `json:"upstream_h2c"`
}

// KiBPerStream is the RSS growth per stream asked for.
func (i Idle) KiBPerStream() float64 {
	if i.Streams == 0 {
		return 0
	}
	return float64(i.RSSHoldKiB-i.RSSBeforeKiB) / float64(i.Streams)
}

// Meta describes the machine and the run.
type Meta struct {
	Date    string `json:"date"`
	NProc   int    `json:"nproc"`
	CPU     string `json:"cpu"`
	Kernel  string `json:"kernel"`
	Go      string `json:"go"`
	Commit  string `json:"commit"`
	Quick   bool   `json:"quick"`
	Only    string `json:"only"`
	Nginx   string `json:"nginx"`
	Caddy   string `json:"caddy"`
	NoFile  int    `json:"nofile"`
	IdleH2C bool   `json:"idle_h2c"`
}

// Suite is everything one run of run.sh wrote under OUTDIR/raw.
type Suite struct {
	Meta    Meta
	Reports map[string]*Report // by file name without .json: "t1-sluice"
	Sweeps  map[string]*Sweep  // "t6-sweep", "t6-sweep-queue"
	Idle    map[string]*Idle   // by proxy
	IdleRun map[string]*Report // the load generator's report of each idle run
}

// Load reads dir/raw/*.json.
func Load(dir string) (*Suite, error) {
	raw := filepath.Join(dir, "raw")
	s := &Suite{Reports: map[string]*Report{}, Sweeps: map[string]*Sweep{}, Idle: map[string]*Idle{}, IdleRun: map[string]*Report{}}
	names, err := filepath.Glob(filepath.Join(raw, "*.json"))
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("no JSON files in %s", raw)
	}
	var errs []error
	for _, path := range names {
		name := strings.TrimSuffix(filepath.Base(path), ".json")
		var dst any
		switch {
		case name == "meta":
			dst = &s.Meta
		case strings.HasPrefix(name, "t6-"):
			sw := &Sweep{}
			s.Sweeps[name], dst = sw, sw
		case strings.HasPrefix(name, "t4-") && strings.HasSuffix(name, "-bench"):
			r := &Report{}
			s.IdleRun[strings.TrimSuffix(strings.TrimPrefix(name, "t4-"), "-bench")], dst = r, r
		case strings.HasPrefix(name, "t4-"):
			i := &Idle{}
			s.Idle[strings.TrimPrefix(name, "t4-")], dst = i, i
		default:
			r := &Report{}
			s.Reports[name], dst = r, r
		}
		if err := readJSON(path, dst); err != nil {
			errs = append(errs, err)
		}
	}
	return s, errors.Join(errs...)
}

func readJSON(path string, dst any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return fmt.Errorf("%s: empty", path)
	}
	if err := json.Unmarshal(b, dst); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// Verdict of one row.
const (
	Pass       = "pass"
	Miss       = "**miss**"
	ReportOnly = "report"
	NoData     = "no data"
)

// Issue 22's goals ("Data plane at nginx's cost"), judged against nginx
// in the same run.
const (
	// CPUPerTokenVsNginx bounds h1 CPU per 1,000 tokens ÷ nginx's.
	CPUPerTokenVsNginx = 1.0
	// RSSVsNginx bounds RSS per held idle stream ÷ nginx's.
	RSSVsNginx = 1.0
	// SparseP99OverNginxMs bounds sparse added P99 − nginx's (ms).
	SparseP99OverNginxMs = 0.2
	// DelayP50BeforeMs and DelayP99BeforeMs are the added per-token
	// delays before issue 22 (target 1): "no worse".
	DelayP50BeforeMs = 0.12
	DelayP99BeforeMs = 0.33
	// ProtoCPUVsH1 bounds h2 and h3 CPU per token ÷ h1's.
	ProtoCPUVsH1 = 1.2
	// SmallCPUVsNginx bounds CPU per small request ÷ nginx's.
	SmallCPUVsNginx = 2.0
	// SmallRPSVsDirect is the least requests/s ÷ direct for small requests.
	SmallRPSVsDirect = 0.6
)

// Row is one line of the results table.
type Row struct {
	Target string
	Figure string
	// Cells by proxy ("sluice", "nginx", "caddy"); empty: not measured.
	Cells  map[string]string
	Direct string
	Ratio  string
	Goal   string
	Result string
	// Key names the issue-22 goal the row judges (see Issue22); empty
	// for the other rows.
	Key string
	// VsNginx is Sluice's figure against nginx's (or against the figure
	// before issue 22) as the issue-22 goal compares them.
	VsNginx string
}

// Rows computes the table, in target order.
func (s *Suite) Rows() []Row {
	var rows []Row
	rows = append(rows, s.t1Rows()...)
	rows = append(rows, s.h2h3Rows()...)
	rows = append(rows, s.smallRows()...)
	rows = append(rows, s.idleRows()...)
	rows = append(rows, s.redisRows()...)
	rows = append(rows, s.sparseRows()...)
	rows = append(rows, s.truncRows()...)
	rows = append(rows, s.sweepRows()...)
	return rows
}

func f(v float64, prec int) string { return fmt.Sprintf("%.*f", prec, v) }

func signed(v float64, prec int) string { return fmt.Sprintf("%+.*f", prec, v) }

func verdict(ok bool) string {
	if ok {
		return Pass
	}
	return Miss
}

// deltaRow is what a proxy adds to the direct connection for one metric
// ("token_delay", "ttft") at one percentile, for every proxy. It returns
// the added milliseconds by proxy for the caller's verdict.
func (s *Suite) deltaRow(num, figure, pattern, metric, stat string) (Row, map[string]float64, bool) {
	r := Row{Target: num, Figure: figure, Cells: map[string]string{}, Goal: ReportOnly, Result: ReportOnly}
	added := map[string]float64{}
	for _, p := range Proxies {
		rep := s.Reports[fmt.Sprintf(pattern, p)]
		x, ok := rep.row(metric, stat)
		if !ok {
			continue
		}
		added[p] = x.DeltaMs
		r.Cells[p] = signed(x.DeltaMs, 3)
		if p == "sluice" {
			r.Direct = f(x.BaselineMs, 3)
			r.Ratio = f(x.Ratio, 3)
		}
	}
	return r, added, len(added) > 0
}

// delayRow is the added per-token delay at one percentile.
func (s *Suite) delayRow(num, label, pattern, stat string) (Row, map[string]float64, bool) {
	return s.deltaRow(num, label+" added per-token delay "+strings.ToUpper(stat)+" (ms)", pattern, "token_delay", stat)
}

// judgeBefore judges Sluice's added delay against the figure before
// issue 22 ("no worse").
func judgeBefore(r *Row, added map[string]float64, before float64, key string) {
	r.Key, r.Goal = key, "≤ "+signed(before, 2)+" (before issue 22)"
	v, ok := added["sluice"]
	if !ok {
		r.Result = NoData
		return
	}
	r.VsNginx = fmt.Sprintf("%s vs %s before", signed(v, 2), signed(before, 2))
	r.Result = verdict(v <= before)
}

// judgeVsNginx judges a row whose goal is Sluice's figure ≤ nginx's + over
// (a difference: added delays); without nginx in the run there is no verdict.
func judgeVsNginx(r *Row, vals map[string]float64, over float64, key, goal string) {
	r.Key, r.Goal = key, goal
	sv, oks := vals["sluice"]
	nv, okn := vals["nginx"]
	if !oks || !okn {
		r.Result = NoData
		return
	}
	r.VsNginx = signed(sv-nv, 3) + " ms"
	r.Result = verdict(sv <= nv+over)
}

// judgeRatioNginx judges a row whose goal is Sluice's figure ≤ limit ×
// nginx's.
func judgeRatioNginx(r *Row, vals map[string]float64, limit float64, key string) {
	r.Key, r.Goal = key, "≤ "+f(limit, 1)+"× nginx"
	sv, oks := vals["sluice"]
	nv, okn := vals["nginx"]
	if !oks || !okn || nv <= 0 {
		r.Result = NoData
		return
	}
	ratio := sv / nv
	r.VsNginx = "×" + f(ratio, 2)
	r.Ratio = r.VsNginx + " nginx"
	r.Result = verdict(ratio <= limit)
}

// cpuRow is the proxy CPU per 1,000 output tokens; vals by proxy.
func (s *Suite) cpuRow(num, label, pattern string) (Row, map[string]float64, bool) {
	r := Row{Target: num, Figure: label + " proxy CPU per 1,000 tokens (ms)", Cells: map[string]string{}, Direct: "—", Ratio: "—",
		Goal: ReportOnly, Result: ReportOnly}
	vals := map[string]float64{}
	for _, p := range Proxies {
		t, ok := s.Reports[fmt.Sprintf(pattern, p)].side(0)
		if !ok || len(t.CPU) == 0 {
			continue
		}
		vals[p] = t.cpuPer1k()
		r.Cells[p] = f(t.cpuPer1k(), 1)
	}
	return r, vals, len(vals) > 0
}

// t1Rows: 64 h1 streams. The per-token delays are judged against the
// figures before issue 22, CPU per token and the added TTFT P50 against
// nginx's.
func (s *Suite) t1Rows() []Row {
	var rows []Row
	if r, added, ok := s.delayRow("1", "h1", "t1-%s", "p50"); ok {
		judgeBefore(&r, added, DelayP50BeforeMs, "delay-p50")
		rows = append(rows, r)
	}
	if r, added, ok := s.delayRow("1", "h1", "t1-%s", "p99"); ok {
		judgeBefore(&r, added, DelayP99BeforeMs, "delay-p99")
		rows = append(rows, r)
	}
	if r, vals, ok := s.cpuRow("1", "h1", "t1-%s"); ok {
		judgeRatioNginx(&r, vals, CPUPerTokenVsNginx, "cpu-h1")
		rows = append(rows, r)
	}
	if r, added, ok := s.deltaRow("1", "h1 added TTFT P50 at 64 streams (ms)", "t1-%s", "ttft", "p50"); ok {
		judgeVsNginx(&r, added, 0, "ttft-p50", "≤ nginx's")
		rows = append(rows, r)
	}
	if r, _, ok := s.deltaRow("1", "h1 added TTFT P99 at 64 streams (ms)", "t1-%s", "ttft", "p99"); ok {
		rows = append(rows, r)
	}
	// 1r: the simulator on a new connection per stream against itself kept
	// alive (the price of a reconnect, in the Sluice column).
	for _, stat := range []string{"p50", "p99"} {
		x, ok := s.Reports["t1r-direct"].row("ttft", stat)
		if !ok {
			continue
		}
		rows = append(rows, Row{Target: "1r", Figure: "direct on a new connection per stream: added TTFT " + strings.ToUpper(stat) + " (ms)",
			Cells: map[string]string{"sluice": signed(x.DeltaMs, 3)}, Direct: f(x.BaselineMs, 3), Ratio: f(x.Ratio, 3), Goal: ReportOnly, Result: ReportOnly})
	}
	return rows
}

func (s *Suite) h2h3Rows() []Row {
	var rows []Row
	for _, proto := range []string{"h2", "h3"} {
		pattern := "t2-" + proto + "-%s"
		for _, stat := range []string{"p50", "p99"} {
			if r, _, ok := s.delayRow("2", proto, pattern, stat); ok {
				rows = append(rows, r)
			}
		}
		if r, _, ok := s.cpuRow("2", proto, pattern); ok {
			rows = append(rows, r)
		}
	}
	h1, ok1 := s.Reports["t1-sluice"].side(0)
	h2, ok2 := s.Reports["t2-h2-sluice"].side(0)
	h3, ok3 := s.Reports["t2-h3-sluice"].side(0)
	for _, x := range []struct {
		proto string
		t     target
		ok    bool
	}{{"h2", h2, ok2}, {"h3", h3, ok3}} {
		if !x.ok || len(x.t.CPU) == 0 {
			continue
		}
		r := Row{Target: "2", Figure: x.proto + " CPU per token ÷ h1 CPU per token (target 1)", Cells: map[string]string{},
			Direct: "—", Ratio: "—", Goal: "≤ " + f(ProtoCPUVsH1, 1) + "× h1", Result: NoData, Key: "cpu-" + x.proto + "-h1"}
		if ok1 && h1.cpuPer1k() > 0 {
			ratio := x.t.cpuPer1k() / h1.cpuPer1k()
			r.Cells["sluice"], r.Ratio, r.VsNginx = f(ratio, 2), f(ratio, 2), "—"
			r.Result = verdict(ratio <= ProtoCPUVsH1)
		}
		rows = append(rows, r)
	}
	if ok2 && ok3 && h2.cpuPer1k() > 0 {
		ratio := h3.cpuPer1k() / h2.cpuPer1k()
		rows = append(rows, Row{Target: "2", Figure: "h3 CPU per token ÷ h2 CPU per token", Cells: map[string]string{"sluice": f(ratio, 2)},
			Direct: "—", Ratio: f(ratio, 2), Goal: ReportOnly, Result: ReportOnly})
	}
	return rows
}

func (s *Suite) smallRows() []Row {
	rps := Row{Target: "3", Figure: "non-streamed requests/s (ratio to direct)", Cells: map[string]string{},
		Goal: "ratio ≥ " + f(SmallRPSVsDirect, 1), Result: NoData, Key: "small-rps"}
	us := Row{Target: "3", Figure: "proxy CPU per request (µs)", Cells: map[string]string{}, Direct: "—", Ratio: "—"}
	vals := map[string]float64{}
	rpsRatio := map[string]float64{}
	for _, p := range Proxies {
		rep := s.Reports["t3-"+p]
		t, ok := rep.side(0)
		b, okb := rep.side(1)
		if !ok || !okb {
			continue
		}
		ratio := 0.0
		if b.RequestsPerSec > 0 {
			ratio = t.RequestsPerSec / b.RequestsPerSec
		}
		rpsRatio[p] = ratio
		rps.Cells[p] = fmt.Sprintf("%.0f (×%.2f)", t.RequestsPerSec, ratio)
		if len(t.CPU) > 0 && t.Counts.Sent > 0 {
			vals[p] = t.cpuMs() * 1000 / float64(t.Counts.Sent)
			us.Cells[p] = f(vals[p], 1)
		}
		if p == "sluice" {
			rps.Direct = f(b.RequestsPerSec, 0)
			rps.Ratio = f(ratio, 2)
			rps.Result = verdict(ratio >= SmallRPSVsDirect)
			rps.VsNginx = "×" + f(ratio, 2) + " direct"
		}
	}
	if len(rpsRatio) == 0 {
		return nil
	}
	judgeRatioNginx(&us, vals, SmallCPUVsNginx, "small-cpu")
	return []Row{us, rps}
}

func (s *Suite) idleRows() []Row {
	if len(s.Idle) == 0 {
		return nil
	}
	held := Row{Target: "4", Figure: "idle streams held / asked (failed)", Cells: map[string]string{}, Direct: "—", Ratio: "—", Goal: "10,000, 0 failed (issue 8)"}
	mem := Row{Target: "4", Figure: "RSS per held stream (KiB)", Cells: map[string]string{}, Direct: "—", Ratio: "—"}
	vals := map[string]float64{}
	for _, p := range Proxies {
		i, ok := s.Idle[p]
		if !ok {
			continue
		}
		failed := -1
		if rep, ok := s.IdleRun[p].side(0); ok {
			failed = rep.Counts.failed() + rep.Counts.Status5xx + rep.Counts.Status429
		}
		failedText := "?"
		if failed >= 0 {
			failedText = fmt.Sprint(failed)
		}
		held.Cells[p] = fmt.Sprintf("%d / %d (%s)", i.Held, i.Streams, failedText)
		mem.Cells[p] = f(i.KiBPerStream(), 1)
		vals[p] = i.KiBPerStream()
		if p == "sluice" {
			held.Result = verdict(i.Streams >= 10000 && i.Held >= i.Streams && failed == 0)
			if i.UpstreamH2C {
				held.Figure += " (Sluice: h2c upstream)"
			}
		}
	}
	judgeRatioNginx(&mem, vals, RSSVsNginx, "rss")
	return []Row{held, mem}
}

func (s *Suite) redisRows() []Row {
	rep := s.Reports["t5-redis"]
	x, ok := rep.row("ttft", "p99")
	if !ok {
		return nil
	}
	return []Row{{Target: "5", Figure: "Redis limiter: added TTFT P99 vs local limiter (ms)", Cells: map[string]string{"sluice": signed(x.DeltaMs, 3)},
		Direct: f(x.BaselineMs, 3) + " (local)", Ratio: f(x.Ratio, 3), Goal: "≤ 1 (issue 8)", Result: verdict(x.DeltaMs <= 1)}}
}

func (s *Suite) sparseRows() []Row {
	var rows []Row
	if r, _, ok := s.delayRow("5b", "sparse", "t5b-%s", "p50"); ok {
		rows = append(rows, r)
	}
	if r, added, ok := s.delayRow("5b", "sparse", "t5b-%s", "p99"); ok {
		judgeVsNginx(&r, added, SparseP99OverNginxMs, "sparse-p99", "≤ nginx's + "+f(SparseP99OverNginxMs, 1))
		rows = append(rows, r)
	}
	return rows
}

// truncRows counts truncated streams over every report (5c).
func (s *Suite) truncRows() []Row {
	r := Row{Target: "5c", Figure: "truncated streams, all runs (streams)", Cells: map[string]string{}, Goal: "0", Key: "truncated"}
	total := map[string]int{}
	streams := map[string]int{}
	direct := 0
	seen := false
	for name, rep := range s.Reports {
		if name == "t1r-direct" { // no proxy: both sides are the simulator
			for _, t := range rep.Targets {
				direct += t.Counts.Truncated
			}
			continue
		}
		for i, t := range rep.Targets {
			seen = true
			who := proxyOf(name)
			if i == 1 && rep.Comparison != nil && name != "t5-redis" {
				direct += t.Counts.Truncated
				continue
			}
			total[who] += t.Counts.Truncated
			streams[who] += t.Counts.Sent
		}
	}
	for name, rep := range s.IdleRun {
		for _, t := range rep.Targets {
			seen = true
			total[name] += t.Counts.Truncated
			streams[name] += t.Counts.Sent
		}
	}
	for _, sw := range s.Sweeps {
		for _, p := range sw.Points {
			seen = true
			total["sluice"] += p.Counts.Truncated
			streams["sluice"] += p.Counts.Sent
		}
	}
	if !seen {
		return nil
	}
	for _, p := range Proxies {
		if n, ok := streams[p]; ok {
			r.Cells[p] = fmt.Sprintf("%d (of %d)", total[p], n)
		}
	}
	r.Direct = fmt.Sprint(direct)
	r.Ratio = "—"
	r.Result = verdict(total["sluice"] == 0)
	return []Row{r}
}

// proxyOf is the proxy a report name measures ("t1-nginx" → "nginx").
func proxyOf(name string) string {
	for _, p := range Proxies {
		if strings.HasSuffix(name, "-"+p) {
			return p
		}
	}
	return "sluice" // t2-h2, t5-redis: Sluice only (t1r-direct: neither, see truncRows)
}

// Goal22 is one line of issue 22's goal table.
type Goal22 struct {
	Key, Figure, Goal string
	Targets           string // the run.sh targets that measure it
}

// Issue22Goals are issue 22's goals in the issue's order.
var Issue22Goals = []Goal22{
	{"cpu-h1", "h1 CPU per 1,000 tokens", "≤ 1.0× nginx", "1"},
	{"rss", "RSS per held idle stream", "≤ 1.0× nginx", "4"},
	{"sparse-p99", "sparse streams (1 token/s) added P99", "≤ nginx's + 0.2 ms", "5b"},
	{"delay-p50", "added per-token delay P50 (target 1)", "no worse (≤ +0.12 ms)", "1"},
	{"delay-p99", "added per-token delay P99 (target 1)", "no worse (≤ +0.33 ms)", "1"},
	{"ttft-p50", "added TTFT P50 at 64 streams (target 1)", "≤ nginx's", "1"},
	{"cpu-h2-h1", "h2 CPU per token ÷ h1", "≤ 1.2", "1,2"},
	{"cpu-h3-h1", "h3 CPU per token ÷ h1", "≤ 1.2", "1,2"},
	{"small-cpu", "CPU per small non-streamed request", "≤ 2× nginx", "3"},
	{"small-rps", "small requests/s ÷ direct", "≥ 0.6", "3"},
	{"truncated", "truncated streams", "0", "all"},
}

// Issue22 is issue 22's goal table from the rows: the row judging each
// goal, or a "not run" row.
func (s *Suite) Issue22(rows []Row) []Row {
	out := make([]Row, 0, len(Issue22Goals))
	for _, g := range Issue22Goals {
		r := Row{Figure: g.Figure, Target: g.Targets, Cells: map[string]string{}, Goal: g.Goal, Result: "not run", Key: g.Key}
		for _, x := range rows {
			if x.Key == g.Key {
				r.Cells, r.VsNginx, r.Result = x.Cells, x.VsNginx, x.Result
				break
			}
		}
		out = append(out, r)
	}
	return out
}

// SweepSummary is the part of a sweep the table reports.
type SweepSummary struct {
	BestRPS     float64 // highest successful requests/s of any point
	TopRate     float64 // the highest load level
	TopP99TTFT  float64 // P99 TTFT (ms) at the highest load level
	KneeRate    float64
	KneeP99TTFT float64
	Refused     int // 503 and 429 over all points
}

// Summary summarises a sweep.
func (sw *Sweep) Summary() SweepSummary {
	var s SweepSummary
	for _, p := range sw.Points {
		s.BestRPS = max(s.BestRPS, p.RequestsPerSec)
		if p.Value >= s.TopRate {
			s.TopRate, s.TopP99TTFT = p.Value, p.TTFT.P99ms
		}
		if p.Knee {
			s.KneeRate, s.KneeP99TTFT = p.Value, p.TTFT.P99ms
		}
		s.Refused += p.Counts.Status5xx + p.Counts.Status429
	}
	return s
}

// MaxQueueWaitMs is the edge queue's max_queue_wait in run.sh.
const MaxQueueWaitMs = 2000

func (s *Suite) sweepRows() []Row {
	plain, okp := s.Sweeps["t6-sweep"]
	queue, okq := s.Sweeps["t6-sweep-queue"]
	var rows []Row
	if okp {
		p := plain.Summary()
		rows = append(rows, Row{Target: "6", Figure: fmt.Sprintf("no edge queue: best req/s; P99 TTFT at rate %g (ms); knee at rate %g", p.TopRate, p.KneeRate),
			Cells: map[string]string{"sluice": fmt.Sprintf("%.1f; %.0f", p.BestRPS, p.TopP99TTFT)}, Direct: "—", Ratio: "—", Goal: "report", Result: ReportOnly})
	}
	if okq {
		q := queue.Summary()
		r := Row{Target: "6", Figure: fmt.Sprintf("with edge queue: best req/s; P99 TTFT at rate %g (ms); 503s", q.TopRate),
			Cells: map[string]string{"sluice": fmt.Sprintf("%.1f; %.0f; %d", q.BestRPS, q.TopP99TTFT, q.Refused)}, Direct: "—",
			Goal: fmt.Sprintf("P99 TTFT ≤ knee P99 + %d ms; req/s ≥ 0.9 × no queue (issue 8)", MaxQueueWaitMs), Result: ReportOnly}
		if okp {
			p := plain.Summary()
			ratio := 0.0
			if p.BestRPS > 0 {
				ratio = q.BestRPS / p.BestRPS
			}
			r.Ratio = "×" + f(ratio, 2) + " req/s"
			bounded := q.TopP99TTFT <= p.KneeP99TTFT+MaxQueueWaitMs
			r.Result = verdict(bounded && ratio >= 0.9)
		}
		rows = append(rows, r)
	}
	return rows
}

// WriteMarkdown writes results.md: the machine, the table and the sweeps.
func (s *Suite) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	m := s.Meta
	fmt.Fprintf(&b, "# Sluice benchmark results\n\n")
	fmt.Fprintf(&b, "Run %s on %d × %s (kernel %s, %s, commit %s", m.Date, m.NProc, m.CPU, m.Kernel, m.Go, m.Commit)
	if m.Quick {
		b.WriteString(", QUICK=1: shortened smoke run")
	}
	fmt.Fprintf(&b, "). References: nginx %s, Caddy %s. Open-file limit %d.\n\n", orNone(m.Nginx), orNone(m.Caddy), m.NoFile)
	b.WriteString("Delays are added to the direct connection to the simulator measured in the same interleaved run " +
		"(`sluice bench -compare`); the direct column is the direct figure of Sluice's run. " +
		"Reference cells come from their own runs against the same simulator. Verdicts judge Sluice.\n\n")
	rows := s.Rows()
	b.WriteString("## Issue 22's goals\n\n" +
		"Judged against nginx in this run (the nginx cell; \"no data\" when nginx or a target did not run). " +
		"\"vs nginx\" is Sluice's figure as the goal compares it: a ratio to nginx's, a difference from nginx's, " +
		"or the figure before issue 22.\n\n")
	b.WriteString("| figure | targets | Sluice | nginx | Caddy | vs nginx | goal | result |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range s.Issue22(rows) {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", r.Figure, r.Target,
			cell(r.Cells["sluice"]), cell(r.Cells["nginx"]), cell(r.Cells["caddy"]), cell(r.VsNginx), r.Goal, r.Result)
	}
	b.WriteString("\n## All figures\n\n" +
		"Goals are issue 22's where it sets one; rows marked issue 8 keep that issue's goal, \"report\" rows have none.\n\n")
	b.WriteString("| target | figure | Sluice | nginx | Caddy | direct | ratio | goal | result |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.Target, r.Figure,
			cell(r.Cells["sluice"]), cell(r.Cells["nginx"]), cell(r.Cells["caddy"]), cell(r.Direct), cell(r.Ratio), r.Goal, r.Result)
	}
	for _, name := range sortedKeys(s.Sweeps) {
		fmt.Fprintf(&b, "\n## %s\n\n| rate | req/s | TTFT P50 ms | TTFT P99 ms | ITL P99 ms | ok | 5xx | errors | truncated | knee |\n", name)
		b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
		for _, p := range s.Sweeps[name].Points {
			knee := ""
			if p.Knee {
				knee = "knee"
			}
			fmt.Fprintf(&b, "| %g | %.1f | %.1f | %.1f | %.1f | %d | %d | %d | %d | %s |\n", p.Value, p.RequestsPerSec,
				p.TTFT.P50ms, p.TTFT.P99ms, p.ITL.P99ms, p.Counts.OK, p.Counts.Status5xx, p.Counts.Errors, p.Counts.Truncated, knee)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func cell(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

func orNone(s string) string {
	if s == "" {
		return "not run"
	}
	return s
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// WriteFile loads dir and writes dir/results.md. A partial run (some files
// unreadable) still gets a table; the error names what was skipped.
func WriteFile(dir string) error {
	s, err := Load(dir)
	if s == nil {
		return err
	}
	out, cerr := os.Create(filepath.Join(dir, "results.md"))
	if cerr != nil {
		return cerr
	}
	werr := s.WriteMarkdown(out)
	return errors.Join(err, werr, out.Close())
}
