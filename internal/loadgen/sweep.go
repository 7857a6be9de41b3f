package loadgen

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Sweep kinds.
const (
	SweepConcurrency = "concurrency"
	SweepRate        = "rate"
)

// SweepSpec is a series of load levels. The zero value is no sweep.
type SweepSpec struct {
	// Kind is SweepConcurrency or SweepRate; empty means no sweep.
	Kind string
	// Values are the concurrencies (whole numbers) or rates (req/s).
	Values []float64
}

// ParseSweep parses "concurrency=1,2,4,8" or "rate=5,10,20".
func ParseSweep(s string) (SweepSpec, error) {
	kind, list, ok := strings.Cut(strings.TrimSpace(s), "=")
	if !ok || (kind != SweepConcurrency && kind != SweepRate) {
		return SweepSpec{}, fmt.Errorf("sweep %q: want concurrency=N,N,… or rate=R,R,…", s)
	}
	sp := SweepSpec{Kind: kind}
	for f := range strings.SplitSeq(list, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v <= 0 || math.IsInf(v, 0) || (kind == SweepConcurrency && v != math.Trunc(v)) {
			return SweepSpec{}, fmt.Errorf("sweep %q: bad value %q", s, f)
		}
		sp.Values = append(sp.Values, v)
	}
	return sp, nil
}

// String formats the spec as ParseSweep reads it.
func (s SweepSpec) String() string {
	if s.Kind == "" {
		return ""
	}
	vs := make([]string, len(s.Values))
	for i, v := range s.Values {
		vs[i] = strconv.FormatFloat(v, 'g', -1, 64)
	}
	return s.Kind + "=" + strings.Join(vs, ",")
}

// Set implements flag.Value.
func (s *SweepSpec) Set(v string) error {
	sp, err := ParseSweep(v)
	if err != nil {
		return err
	}
	*s = sp
	return nil
}

// Point is one load level of a sweep.
type Point struct {
	// Kind and Value are the load level (concurrency or rate).
	Kind  string  `json:"kind"`
	Value float64 `json:"value"`
	// RequestsPerSec and OutputTokensPerSec are the throughput reached.
	RequestsPerSec     float64 `json:"requests_per_s"`
	OutputTokensPerSec float64 `json:"output_tokens_per_s"`
	// TTFT, ITL and E2E are the client-observed latencies.
	TTFT Percentiles `json:"ttft"`
	ITL  Percentiles `json:"itl"`
	E2E  Percentiles `json:"e2e"`
	// TokenDelay is the per-token delivery delay (see
	// TargetReport.TokenDelay); N == 0 without stamped chunks.
	TokenDelay Percentiles `json:"token_delay"`
	// Counts are the request outcomes.
	Counts Counts `json:"counts"`
	// Knee marks the knee of the curve (see FindKnee).
	Knee bool `json:"knee"`
}

// Label is the load level as "c=8" or "r=20".
func (p Point) Label() string {
	if p.Kind == SweepRate {
		return "r=" + strconv.FormatFloat(p.Value, 'g', -1, 64)
	}
	return "c=" + strconv.FormatFloat(p.Value, 'g', -1, 64)
}

// Sweep runs cfg once per value of cfg.Sweep (each run bounded by the
// Duration/Requests of cfg, with its own warm-up), in order, and returns
// the points with the knee marked. It stops at the first failed run and
// returns the points measured so far with the error.
func Sweep(ctx context.Context, cfg Config, progress io.Writer) ([]Point, error) {
	if cfg.Sweep.Kind == "" || len(cfg.Sweep.Values) == 0 {
		return nil, errors.New("no sweep values")
	}
	var points []Point
	for _, v := range cfg.Sweep.Values {
		c := cfg
		c.Sweep = SweepSpec{}
		c.label = Point{Kind: cfg.Sweep.Kind, Value: v}.Label()
		if cfg.Sweep.Kind == SweepRate {
			c.Rate = v
		} else {
			c.Rate, c.Concurrency = 0, int(v)
		}
		rep, err := Run(ctx, c, progress)
		if rep != nil {
			points = append(points, pointOf(cfg.Sweep.Kind, v, &rep.Targets[0]))
		}
		if err != nil {
			markKnee(points)
			return points, fmt.Errorf("sweep %s=%g: %w", cfg.Sweep.Kind, v, err)
		}
	}
	markKnee(points)
	return points, nil
}

func pointOf(kind string, v float64, t *TargetReport) Point {
	return Point{Kind: kind, Value: v, RequestsPerSec: t.RequestsPerSec, OutputTokensPerSec: t.OutputTokensPerSec,
		TTFT: t.TTFT, ITL: t.ITL, E2E: t.E2E, TokenDelay: t.TokenDelay, Counts: t.Counts}
}

func markKnee(points []Point) {
	for i := range points {
		points[i].Knee = false
	}
	if k := FindKnee(points); k >= 0 {
		points[k].Knee = true
	}
}

// FindKnee returns the index of the knee of a sweep, or -1: the first
// point (after the first) where P95 TTFT exceeds twice its low-load value
// (the first point's), or where throughput grew by less than 10% over the
// previous point (more load no longer buys throughput, only queueing).
// Throughput is output tokens/s, or requests/s when no tokens were counted.
func FindKnee(points []Point) int {
	if len(points) < 2 {
		return -1
	}
	tput := throughputOf(points)
	base := points[0].TTFT.P95
	for i := 1; i < len(points); i++ {
		if base > 0 && points[i].TTFT.P95 > 2*base {
			return i
		}
		if prev := tput(i - 1); prev > 0 && (tput(i)-prev)/prev < 0.10 {
			return i
		}
	}
	return -1
}

// throughputOf picks the throughput measure of a sweep.
func throughputOf(points []Point) func(i int) float64 {
	for _, p := range points {
		if p.OutputTokensPerSec > 0 {
			return func(i int) float64 { return points[i].OutputTokensPerSec }
		}
	}
	return func(i int) float64 { return points[i].RequestsPerSec }
}

// WriteSweepCSV writes one row per point.
func WriteSweepCSV(w io.Writer, points []Point) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"kind", "value", "requests_per_s", "output_tokens_per_s",
		"ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p95_ms", "itl_p99_ms",
		"e2e_p50_ms", "e2e_p95_ms", "sent", "ok", "status_429", "status_5xx", "errors", "truncated", "knee"})
	for _, p := range points {
		_ = cw.Write([]string{p.Kind, fmtFloat(p.Value), fmtFloat(p.RequestsPerSec), fmtFloat(p.OutputTokensPerSec),
			fmtFloat(ms(p.TTFT.P50)), fmtFloat(ms(p.TTFT.P95)), fmtFloat(ms(p.TTFT.P99)),
			fmtFloat(ms(p.ITL.P50)), fmtFloat(ms(p.ITL.P95)), fmtFloat(ms(p.ITL.P99)),
			fmtFloat(ms(p.E2E.P50)), fmtFloat(ms(p.E2E.P95)),
			strconv.Itoa(p.Counts.Sent), strconv.Itoa(p.Counts.OK), strconv.Itoa(p.Counts.Status429),
			strconv.Itoa(p.Counts.Status5xx), strconv.Itoa(p.Counts.Errors), strconv.Itoa(p.Counts.Truncated),
			strconv.FormatBool(p.Knee)})
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("writing sweep csv: %w", err)
	}
	return nil
}

// WriteSweepTable writes the points as aligned text.
func WriteSweepTable(w io.Writer, points []Point) error {
	fmt.Fprintln(w, "latency in ms; knee: first point with P95 TTFT > 2× the first point's, or < 10% more throughput than the previous point")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "load\treq/s\ttok/s\tttft p50\tttft p95\tttft p99\titl p50\titl p95\titl p99\tok\t429\t5xx\terrors\ttruncated\t\n")
	for _, p := range points {
		knee := ""
		if p.Knee {
			knee = "<- knee"
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%.0f\t%.1f\t%.1f\t%.1f\t%.2f\t%.2f\t%.2f\t%d\t%d\t%d\t%d\t%d\t %s\n",
			p.Label(), p.RequestsPerSec, p.OutputTokensPerSec, ms(p.TTFT.P50), ms(p.TTFT.P95), ms(p.TTFT.P99),
			ms(p.ITL.P50), ms(p.ITL.P95), ms(p.ITL.P99), p.Counts.OK, p.Counts.Status429, p.Counts.Status5xx,
			p.Counts.Errors, p.Counts.Truncated, knee)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing sweep table: %w", err)
	}
	return nil
}

// sweepJSON is the JSON output of a sweep.
type sweepJSON struct {
	Settings Settings `json:"settings"`
	Points   []Point  `json:"points"`
}

func (s *sweepJSON) write(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(s); err != nil {
		return fmt.Errorf("writing sweep json: %w", err)
	}
	return nil
}
