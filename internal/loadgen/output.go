package loadgen

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteTable writes the report as aligned text for a terminal.
func (r *Report) WriteTable(w io.Writer) error {
	ew := &errWriter{w: w}
	s := r.Settings
	load := fmt.Sprintf("closed loop, concurrency %d", s.Concurrency)
	if s.Arrival == "open" {
		load = fmt.Sprintf("open loop, Poisson %g req/s", s.Rate)
	}
	ew.printf("sluice bench: %s workload (prompt %s, output %s tokens), %s, %s, seed %d, stream %t\n",
		s.Workload, s.PromptTokens, s.OutputTokens, load, bound(s), s.Seed, s.Stream)
	for i := range r.Targets {
		r.Targets[i].writeTable(ew)
	}
	if r.Comparison != nil {
		r.Comparison.writeTable(ew, r.Targets)
	}
	return ew.err
}

func bound(s Settings) string {
	var parts []string
	if s.Duration != "" {
		parts = append(parts, s.Duration)
	}
	if s.Requests > 0 {
		parts = append(parts, fmt.Sprintf("%d requests", s.Requests))
	}
	if s.Warmup != "" {
		parts = append(parts, "warm-up "+s.Warmup)
	}
	if s.Ramp != "" {
		parts = append(parts, "ramp "+s.Ramp)
	}
	if s.Rounds > 0 {
		parts = append(parts, fmt.Sprintf("%d rounds per target", s.Rounds))
	}
	return strings.Join(parts, ", ")
}

func (t *TargetReport) writeTable(ew *errWriter) {
	c := t.Counts
	ew.printf("\n%s %s (%s)\n", t.Role, t.URL, t.Protocol)
	ew.printf("  requests    sent %d  ok %d  429 %d  4xx %d  5xx %d  errors %d  stream-errors %d  TRUNCATED %d  canceled %d  dropped %d\n",
		c.Sent, c.OK, c.Status429, c.Status4xx, c.Status5xx, c.Errors, c.StreamErrors, c.Truncated, c.Canceled, c.Dropped)
	ew.printf("  throughput  %.1f req/s  %.0f output tok/s  (%d tokens in %.1fs)\n\n",
		t.RequestsPerSec, t.OutputTokensPerSec, t.OutputTokens, t.WallSeconds)
	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "  %-26s\tn\tp50\tp95\tp99\tmax\t\n", "client (ms)")
	for _, row := range []struct {
		name string
		p    Percentiles
	}{{"ttft", t.TTFT}, {"itl", t.ITL}, {"e2e", t.E2E}, {"token delay", t.TokenDelay}, {"dispatch lag", t.DispatchLag}} {
		if row.name == "dispatch lag" && row.p.Max == 0 {
			continue // closed loop: no schedule to lag behind
		}
		if row.name == "token delay" && row.p.N == 0 {
			continue // the backend does not stamp its chunks
		}
		fmt.Fprintf(tw, "  %-26s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t\n", row.name, row.p.N, ms(row.p.P50), ms(row.p.P95), ms(row.p.P99), ms(row.p.Max))
	}
	if len(t.Stages) > 0 {
		fmt.Fprintf(tw, "  %-26s\tn\tp50\tp95\tp99\tmax\t\n", "server-timing (ms)")
		for _, s := range t.Stages {
			name := s.Name
			switch {
			case s.Name == "network":
				name = "network (client − server)"
			case s.Unit == "":
				name += " (count)"
			}
			fmt.Fprintf(tw, "  %-26s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t\n", name, s.N, s.P50, s.P95, s.P99, s.Max)
		}
	}
	_ = tw.Flush()
	if hasStage(t.Stages, "network") {
		ew.printf("  network = client TTFT − server ttft, per request\n")
	}
	t.writeCPU(ew)
	for _, e := range t.Errors {
		ew.printf("  %d× %s: %s\n", e.Count, e.Class, e.Msg)
	}
}

func hasStage(ss []Stage, name string) bool {
	for _, s := range ss {
		if s.Name == name {
			return true
		}
	}
	return false
}

func (t *TargetReport) writeCPU(ew *errWriter) {
	for _, u := range t.CPU {
		if u.Err != "" {
			ew.printf("  cpu pid %d: %s\n", u.PID, u.Err)
			continue
		}
		ew.printf("  cpu pid %d: %.0f ms, %.2f ms per 1,000 tokens\n", u.PID, u.CPUMs, u.MsPer1kTokens)
	}
	g := t.GeneratorCPU
	if g.Err != "" {
		ew.printf("  cpu of the generator: %s\n", g.Err)
		return
	}
	ew.printf("  cpu of the generator: %.0f ms, %.2f ms per 1,000 tokens\n", g.CPUMs, g.MsPer1kTokens)
}

func (c *Comparison) writeTable(ew *errWriter, ts []TargetReport) {
	ew.printf("\ncomparison: %s vs baseline %s (ratio = target / baseline, delta = target − baseline)\n", c.Target, c.Baseline)
	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "  %-14s\tstat\ttarget ms\tbaseline ms\tratio\tdelta ms\t\n", "metric")
	for _, r := range c.Rows {
		fmt.Fprintf(tw, "  %-14s\t%s\t%.3f\t%.3f\t%.3f\t%+.3f\t\n", r.Metric, r.Stat, r.TargetMs, r.BaselineMs, r.Ratio, r.DeltaMs)
	}
	fmt.Fprintf(tw, "  %-14s\t\t%.0f\t%.0f\t%.3f\t\t\n", "output tok/s", ts[0].OutputTokensPerSec, ts[1].OutputTokensPerSec,
		ratio(ts[0].OutputTokensPerSec, ts[1].OutputTokensPerSec))
	fmt.Fprintf(tw, "  %-14s\t\t%.1f\t%.1f\t%.3f\t\t\n", "requests/s", ts[0].RequestsPerSec, ts[1].RequestsPerSec,
		ratio(ts[0].RequestsPerSec, ts[1].RequestsPerSec))
	for _, u := range ts[0].CPU {
		if b := cpuOf(ts[1].CPU, u.PID); u.Err == "" && b != nil {
			fmt.Fprintf(tw, "  %-14s\t\t%.2f\t%.2f\t%.3f\t%+.2f\t\n", fmt.Sprintf("cpu/1k tok %d", u.PID),
				u.MsPer1kTokens, b.MsPer1kTokens, ratio(u.MsPer1kTokens, b.MsPer1kTokens), u.MsPer1kTokens-b.MsPer1kTokens)
		}
	}
	_ = tw.Flush()
}

func cpuOf(us []CPUUsage, pid int) *CPUUsage {
	for i := range us {
		if us[i].PID == pid && us[i].Err == "" {
			return &us[i]
		}
	}
	return nil
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// WriteJSON writes the report as indented JSON (durations in milliseconds).
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("writing json report: %w", err)
	}
	return nil
}

// WriteCSV writes the report in long form, one figure per row:
// role,url,metric,stat,value. Latencies are in milliseconds (metric names
// end in _ms); comparison rows have role "comparison".
func (r *Report) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"role", "url", "metric", "stat", "value"})
	for i := range r.Targets {
		t := &r.Targets[i]
		row := func(metric, stat string, v float64) {
			_ = cw.Write([]string{t.Role, t.URL, metric, stat, fmtFloat(v)})
		}
		t.csvRows(row)
	}
	if c := r.Comparison; c != nil {
		for _, x := range c.Rows {
			_ = cw.Write([]string{"comparison", c.Target, x.Metric + "_ratio", x.Stat, fmtFloat(x.Ratio)})
			_ = cw.Write([]string{"comparison", c.Target, x.Metric + "_delta_ms", x.Stat, fmtFloat(x.DeltaMs)})
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("writing csv report: %w", err)
	}
	return nil
}

func (t *TargetReport) csvRows(row func(metric, stat string, v float64)) {
	c := t.Counts
	for _, kv := range []struct {
		k string
		v int
	}{{"sent", c.Sent}, {"ok", c.OK}, {"429", c.Status429}, {"4xx", c.Status4xx}, {"5xx", c.Status5xx},
		{"errors", c.Errors}, {"stream_errors", c.StreamErrors}, {"truncated", c.Truncated},
		{"canceled", c.Canceled}, {"dropped", c.Dropped}} {
		row("count", kv.k, float64(kv.v))
	}
	row("throughput", "requests_per_s", t.RequestsPerSec)
	row("throughput", "output_tokens_per_s", t.OutputTokensPerSec)
	row("throughput", "output_tokens", float64(t.OutputTokens))
	row("throughput", "wall_s", t.WallSeconds)
	for _, m := range []struct {
		name string
		p    Percentiles
	}{{"ttft_ms", t.TTFT}, {"itl_ms", t.ITL}, {"e2e_ms", t.E2E}, {"token_delay_ms", t.TokenDelay},
		{"dispatch_lag_ms", t.DispatchLag}} {
		row(m.name, "n", float64(m.p.N))
		for _, s := range stats {
			row(m.name, s, ms(m.p.Get(s)))
		}
	}
	for _, s := range t.Stages {
		name := "stage_" + s.Name
		if s.Unit == "ms" {
			name += "_ms"
		}
		row(name, "n", float64(s.N))
		row(name, "p50", s.P50)
		row(name, "p95", s.P95)
		row(name, "p99", s.P99)
		row(name, "max", s.Max)
	}
	row("cpu_ms_per_1k_tokens", "generator", t.GeneratorCPU.MsPer1kTokens)
	for _, u := range t.CPU {
		row("cpu_ms_per_1k_tokens", "pid_"+strconv.Itoa(u.PID), u.MsPer1kTokens)
	}
}

func fmtFloat(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// WriteRequestsCSV writes one row per measured request.
func (r *Report) WriteRequestsCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"target", "seq", "start_ms", "lag_ms", "prompt_tokens", "max_tokens", "status", "class",
		"truncated", "done", "headers_ms", "ttft_ms", "e2e_ms", "tokens_out", "events", "itl_n", "itl_p50_ms",
		"itl_max_ms", "request_id", "server_timing", "error", "token_delay_n", "token_delay_p50_ms"})
	for i := range r.Results {
		x := &r.Results[i]
		itl := Summarize(append([]time.Duration(nil), x.ITL...))
		delay := Summarize(append([]time.Duration(nil), x.TokenDelay...))
		_ = cw.Write([]string{
			strconv.Itoa(x.Target), strconv.FormatInt(x.Seq, 10), fmtMsF(x.Start), fmtMsF(x.Lag),
			strconv.Itoa(x.PromptTokens), strconv.Itoa(x.MaxTokens), strconv.Itoa(x.Status), string(x.Class),
			strconv.FormatBool(x.Truncated), strconv.FormatBool(x.Done), fmtMsF(x.Headers), fmtMsF(x.TTFT),
			fmtMsF(x.E2E), strconv.Itoa(x.TokensOut), strconv.Itoa(x.Events), strconv.Itoa(itl.N),
			fmtMsF(itl.P50), fmtMsF(itl.Max), x.RequestID, formatTiming(x.Timing), x.Err,
			strconv.Itoa(delay.N), fmtMsF(delay.P50),
		})
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("writing requests csv: %w", err)
	}
	return nil
}

func fmtMsF(d time.Duration) string { return strconv.FormatFloat(ms(d), 'f', 3, 64) }

// formatTiming writes metrics back in Server-Timing syntax (dur only).
func formatTiming(ms []Metric) string {
	parts := make([]string, 0, len(ms))
	for _, m := range ms {
		if m.HasDur {
			parts = append(parts, m.Name+";dur="+fmtFloat(m.Dur))
		} else {
			parts = append(parts, m.Name)
		}
	}
	return strings.Join(parts, ", ")
}

// errWriter keeps the first write error.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

func (e *errWriter) printf(format string, a ...any) { fmt.Fprintf(e, format, a...) }
