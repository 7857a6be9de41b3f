// Package diagnose reads a node's /debug/stats and names the stage that
// dominates latency, following the measure-first logic of docs/TIMING.md:
// saturated GPUs need capacity; a long queue on idle GPUs is a scheduling
// or limits problem; high TTFT with fine ITL is prefill or queueing; high
// ITL is decode and batch size; a dominant network stage is edge placement,
// HTTP/3 and connection reuse.
package diagnose

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/sluice-proxy/sluice/proxy/observe"
)

// Thresholds decide what "high" means when no SLO is configured.
type Thresholds struct {
	// TTFTP95 is a high P95 time to first token, in ms. Default 1000.
	TTFTP95 float64
	// ITLP99 is a high P99 inter-token latency, in ms. Default 100.
	ITLP99 float64
	// Saturated is the engine utilisation (running / capacity) from which
	// GPUs count as saturated. Default 0.9.
	Saturated float64
	// MinRequests is how many requests a window needs to be judged.
	// Default 20.
	MinRequests int
}

func (t Thresholds) withDefaults(slo observe.SLOMillis) Thresholds {
	if slo.TTFTP95 > 0 {
		t.TTFTP95 = slo.TTFTP95
	}
	if slo.ITLP99 > 0 {
		t.ITLP99 = slo.ITLP99
	}
	if t.TTFTP95 == 0 {
		t.TTFTP95 = 1000
	}
	if t.ITLP99 == 0 {
		t.ITLP99 = 100
	}
	if t.Saturated == 0 {
		t.Saturated = 0.9
	}
	if t.MinRequests == 0 {
		t.MinRequests = 20
	}
	return t
}

// Finding is one conclusion, with its reason and what to change.
type Finding struct {
	Kind   string // "capacity", "scheduling", "prefill", "queue", "decode", "network", "ok", "insufficient-data"
	Reason string
	Advice string
}

// RouteReport is the diagnosis of one route.
type RouteReport struct {
	Route    string
	Window   string
	Requests int
	Stages   map[string]observe.Percentiles
	// Dominant is the TTFT component with the largest P95, and its share
	// of the TTFT P95.
	Dominant      string
	DominantShare float64
	Findings      []Finding
	Breaches      []string
}

// groups are the TTFT components the verdict compares.
var groups = []struct {
	name   string
	stages []string
}{
	{"network", []string{observe.StageNetRTT, observe.StageTLS, observe.StageRecv}},
	{"queue", []string{observe.StageLimit, observe.StageQueue}},
	{"upstream", []string{observe.StageUpstream}},
	{"prefill", []string{observe.StagePrefill}},
	{"edge", []string{observe.StageEdge}},
}

// Analyze diagnoses every route of a snapshot.
func Analyze(s observe.StatsSnapshot, th Thresholds) []RouteReport {
	th = th.withDefaults(s.SLO)
	util, known := utilisation(s.Backends)
	var out []RouteReport
	for _, r := range s.Routes {
		out = append(out, analyzeRoute(r, s.SLO, th, util, known))
	}
	return out
}

// utilisation is the mean running/capacity over backends reporting both.
func utilisation(bs []observe.BackendStat) (float64, bool) {
	var sum float64
	n := 0
	for _, b := range bs {
		if b.Capacity > 0 && b.Running != nil {
			sum += *b.Running / float64(b.Capacity)
			n++
		}
	}
	if n == 0 {
		return 0, false
	}
	return sum / float64(n), true
}

func analyzeRoute(r observe.RouteStats, slo observe.SLOMillis, th Thresholds, util float64, utilKnown bool) RouteReport {
	w, label := r.Windows["5m"], "5m"
	if w.Requests < th.MinRequests && r.Windows["1m"].Requests >= th.MinRequests {
		w, label = r.Windows["1m"], "1m"
	}
	rep := RouteReport{Route: r.Route, Window: label, Requests: w.Requests, Stages: w.Stages}
	rep.Breaches = breaches(w.Stages, slo)
	if w.Requests < th.MinRequests {
		rep.Findings = append(rep.Findings, Finding{Kind: "insufficient-data",
			Reason: fmt.Sprintf("%d requests in the last 5 minutes; need %d to judge", w.Requests, th.MinRequests)})
		return rep
	}
	ttft := w.Stages[observe.StageTTFT].P95
	itl := w.Stages[observe.StageITL].P99
	shares := map[string]float64{}
	for _, g := range groups {
		for _, st := range g.stages {
			shares[g.name] += w.Stages[st].P95
		}
	}
	for name, v := range shares {
		if v > shares[rep.Dominant] || rep.Dominant == "" {
			rep.Dominant = name
		}
	}
	if ttft > 0 {
		rep.DominantShare = shares[rep.Dominant] / ttft
	}
	ttftHigh, itlHigh := ttft > th.TTFTP95, itl > th.ITLP99
	queueShare := 0.0
	if ttft > 0 {
		queueShare = shares["queue"] / ttft
	}
	switch {
	case utilKnown && util >= th.Saturated:
		rep.Findings = append(rep.Findings, Finding{Kind: "capacity",
			Reason: fmt.Sprintf("GPUs are saturated: engines run at %.0f%% of their batch slots", util*100),
			Advice: "add GPU capacity (more backends), or shed batch traffic; tuning will not help a full engine"})
	case queueShare > 0.3 && (!utilKnown || util < 0.7):
		why := "engine utilisation is unknown"
		if utilKnown {
			why = fmt.Sprintf("engines run at only %.0f%% of their slots", util*100)
		}
		rep.Findings = append(rep.Findings, Finding{Kind: "scheduling",
			Reason: fmt.Sprintf("requests wait at the edge (queue+limit %.0f%% of TTFT P95) while %s", queueShare*100, why),
			Advice: "a scheduling or limits problem, not capacity: raise the pool's queue target or tenant limits, check max_concurrency per backend"})
	}
	if ttftHigh && !itlHigh {
		kind, stage := "prefill", "prefill"
		if shares["queue"] > shares["prefill"] {
			kind, stage = "queue", "queueing"
		}
		rep.Findings = append(rep.Findings, Finding{Kind: kind,
			Reason: fmt.Sprintf("TTFT P95 %.0f ms is high while ITL P99 %.0f ms is fine; %s dominates", ttft, itl, stage),
			Advice: "shorten prompts or enable prefix caching / chunked prefill for prefill; for queueing, spread load (least_queued) or add capacity"})
	}
	if itlHigh {
		rep.Findings = append(rep.Findings, Finding{Kind: "decode",
			Reason: fmt.Sprintf("ITL P99 %.0f ms is high (threshold %.0f ms)", itl, th.ITLP99),
			Advice: "decode is slow: lower the engine's max batch size (max_num_seqs) or move interactive traffic to a less loaded pool"})
	}
	if rep.Dominant == "network" && rep.DominantShare > 0.5 {
		rep.Findings = append(rep.Findings, Finding{Kind: "network",
			Reason: fmt.Sprintf("the network stage is %.0f%% of TTFT P95", rep.DominantShare*100),
			Advice: "move the edge closer to users, offer HTTP/3, and reuse connections (keep-alive, HTTP/2)"})
	}
	if len(rep.Findings) == 0 {
		rep.Findings = append(rep.Findings, Finding{Kind: "ok",
			Reason: fmt.Sprintf("TTFT P95 %.0f ms and ITL P99 %.0f ms are within bounds", ttft, itl)})
	}
	return rep
}

// breaches lists the SLOs a window misses.
func breaches(st map[string]observe.Percentiles, slo observe.SLOMillis) []string {
	var out []string
	check := func(name string, got, limit float64) {
		if limit > 0 && got > limit {
			out = append(out, fmt.Sprintf("%s %.1f ms > SLO %.1f ms", name, got, limit))
		}
	}
	check("ttft p95", st[observe.StageTTFT].P95, slo.TTFTP95)
	check("itl p99", st[observe.StageITL].P99, slo.ITLP99)
	check("e2e p99", st[observe.StageE2E].P99, slo.E2EP99)
	return out
}

// order is the row order of the stage table.
var order = []string{observe.StageNetRTT, observe.StageTLS, observe.StageAuth, observe.StageRecv, observe.StageRoute,
	observe.StageLimit, observe.StageQueue, observe.StageUpstream, observe.StagePrefill, observe.StageTTFT,
	observe.StageEdge, observe.StageITL, observe.StageDecode, observe.StageE2E}

// Write prints the reports as tables with the verdicts.
func Write(w io.Writer, reps []RouteReport) {
	sort.Slice(reps, func(i, j int) bool { return reps[i].Route < reps[j].Route })
	for _, r := range reps {
		fmt.Fprintf(w, "route %s (%s window, %d requests)\n", r.Route, r.Window, r.Requests)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "  stage\tp50 ms\tp95 ms\tp99 ms\tn\t")
		ttft := r.Stages[observe.StageTTFT].P95
		for _, st := range order {
			p, ok := r.Stages[st]
			if !ok {
				continue
			}
			fmt.Fprintf(tw, "  %s\t%.1f\t%.1f\t%.1f\t%d\t\n", st, p.P50, p.P95, p.P99, p.N)
		}
		tw.Flush()
		if r.Dominant != "" && ttft > 0 {
			fmt.Fprintf(w, "  dominant TTFT stage: %s (%.0f%% of TTFT P95 %.0f ms)\n", r.Dominant, r.DominantShare*100, ttft)
		}
		for _, f := range r.Findings {
			fmt.Fprintf(w, "  verdict [%s]: %s\n", f.Kind, f.Reason)
			if f.Advice != "" {
				fmt.Fprintf(w, "    → %s\n", f.Advice)
			}
		}
		for _, b := range r.Breaches {
			fmt.Fprintf(w, "  SLO BREACHED: %s\n", b)
		}
		fmt.Fprintln(w, strings.Repeat("-", 60))
	}
}

// WritePredictions prints, per backend that has served predicted
// requests, the TTFT prediction's error (predicted − actual, P50 and P95,
// within one histogram bucket) and the measured prefill rate and queue
// wait per waiting request it rests on. A P95 far from zero says the
// prediction (and policy predicted_ttft, and ttft_objective refusals)
// cannot be trusted for that backend. Nothing is printed when no backend
// has predictions.
func WritePredictions(w io.Writer, bs []observe.BackendStat) {
	var rows []observe.BackendStat
	for _, b := range bs {
		if b.PredErrors > 0 && b.PredErrP50MS != nil && b.PredErrP95MS != nil {
			rows = append(rows, b)
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "TTFT prediction error (predicted − actual; negative: predicted too low)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  pool\tbackend\terr p50 ms\terr p95 ms\tn\tprefill tok/s\tqueue ms/waiting\t")
	for _, b := range rows {
		fmt.Fprintf(tw, "  %s\t%s\t%.0f\t%.0f\t%d\t%.0f\t%.1f\t\n", b.Pool, b.URL, *b.PredErrP50MS, *b.PredErrP95MS,
			b.PredErrors, b.PrefillRate, b.QueueWaitMS)
	}
	tw.Flush()
}
