package loadgen

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// Report is the outcome of Run.
type Report struct {
	// Settings describe the run.
	Settings Settings `json:"settings"`
	// Started is when the run began.
	Started time.Time `json:"started"`
	// Targets holds the target's figures, then the baseline's (compare).
	Targets []TargetReport `json:"targets"`
	// Comparison relates Targets[0] to Targets[1]; nil without Compare.
	Comparison *Comparison `json:"comparison,omitempty"`
	// Results are the records of every measured request (warm-up
	// excluded): the target's in completion order, then the baseline's.
	// Not in the JSON output; see WriteRequestsCSV.
	Results []Result `json:"-"`
}

// Settings summarise the Config of a run.
type Settings struct {
	Workload     string  `json:"workload"`
	PromptTokens string  `json:"prompt_tokens"`
	OutputTokens string  `json:"output_tokens"`
	Arrival      string  `json:"arrival"` // "closed" or "open"
	Concurrency  int     `json:"concurrency,omitempty"`
	Rate         float64 `json:"rate,omitempty"`
	Duration     string  `json:"duration,omitempty"`
	Requests     int     `json:"requests,omitempty"`
	Warmup       string  `json:"warmup,omitempty"`
	Ramp         string  `json:"ramp,omitempty"`
	Rounds       int     `json:"rounds,omitempty"`
	Seed         int64   `json:"seed"`
	Stream       bool    `json:"stream"`
	Path         string  `json:"path"`
	Model        string  `json:"model"`
}

// TargetReport holds the figures of one target.
type TargetReport struct {
	// Role is "target" or "baseline".
	Role     string   `json:"role"`
	URL      string   `json:"url"`
	Protocol Protocol `json:"protocol"`
	// Wall is the measured time: from the end of the warm-up to the end of
	// the last request (summed over rounds in compare mode).
	Wall        time.Duration `json:"-"`
	WallSeconds float64       `json:"wall_s"`
	// Counts are the outcomes of the measured requests.
	Counts Counts `json:"counts"`
	// RequestsPerSec counts successful requests; OutputTokensPerSec all
	// output tokens received (also of failed or truncated streams).
	RequestsPerSec     float64 `json:"requests_per_s"`
	OutputTokens       int64   `json:"output_tokens"`
	OutputTokensPerSec float64 `json:"output_tokens_per_s"`
	// TTFT is over requests that received a first token; ITL over every
	// gap of every stream; E2E over successful requests only.
	TTFT Percentiles `json:"ttft"`
	ITL  Percentiles `json:"itl"`
	E2E  Percentiles `json:"e2e"`
	// TokenDelay is over every content event that carried the backend's
	// emit time (EmitField): arrival − emit, per token (N == 0 when the
	// backend does not stamp its chunks).
	TokenDelay Percentiles `json:"token_delay"`
	// TokenDelayFirst is TokenDelay over each request's first stamped
	// token only, TokenDelayRest over the others: the first token is
	// written by a different path in a proxy that hands streams over
	// (Sluice's hand-off) than the tokens after it.
	TokenDelayFirst Percentiles `json:"token_delay_first"`
	TokenDelayRest  Percentiles `json:"token_delay_rest"`
	// TokenDelayLate is TokenDelay over the requests sent 4 s or more
	// into their phase: without the first wave of new connections (dials,
	// accepts, handshakes) of a ramp of up to 2 s.
	TokenDelayLate Percentiles `json:"token_delay_late"`
	// DispatchLag is, in an open loop, how late requests left after their
	// scheduled arrival: a high value means the generator is the bottleneck.
	DispatchLag Percentiles `json:"dispatch_lag"`
	// Stages is the split read from Server-Timing: "network" (client TTFT −
	// server ttft) first, then each metric the server sent.
	Stages []Stage `json:"stages"`
	// CPU is the CPU time of Config.PIDs during this target's measurement;
	// GeneratorCPU that of the load generator itself.
	CPU          []CPUUsage `json:"cpu,omitempty"`
	GeneratorCPU CPUUsage   `json:"generator_cpu"`
	// Errors are up to five distinct error messages with their counts.
	Errors []ErrorSample `json:"errors,omitempty"`
}

// Counts are request outcomes. Sent excludes Dropped.
type Counts struct {
	Sent         int `json:"sent"`
	OK           int `json:"ok"`
	Status429    int `json:"status_429"`
	Status4xx    int `json:"status_4xx"` // other than 429
	Status5xx    int `json:"status_5xx"`
	Errors       int `json:"errors"` // no usable response: connect, tls, transport, protocol, timeout, other status
	StreamErrors int `json:"stream_errors"`
	Truncated    int `json:"truncated"`
	Canceled     int `json:"canceled"`
	Dropped      int `json:"dropped"`
}

func (c *Counts) add(cl ErrorClass) {
	if cl != ClassDropped {
		c.Sent++
	}
	switch cl {
	case ClassOK:
		c.OK++
	case ClassHTTP429:
		c.Status429++
	case ClassHTTP4xx:
		c.Status4xx++
	case ClassHTTP5xx:
		c.Status5xx++
	case ClassStreamError:
		c.StreamErrors++
	case ClassTruncated:
		c.Truncated++
	case ClassCanceled:
		c.Canceled++
	case ClassDropped:
		c.Dropped++
	default:
		c.Errors++
	}
}

// CPUUsage is the CPU time of one process during a measurement.
type CPUUsage struct {
	PID int `json:"pid"`
	// CPUMs is utime+stime used, in milliseconds.
	CPUMs float64 `json:"cpu_ms"`
	// MsPer1kTokens is CPUMs per 1,000 output tokens received (warm-up
	// included, as the CPU time is); 0 when no tokens.
	MsPer1kTokens float64 `json:"ms_per_1k_tokens"`
	// Err is set when /proc could not be read.
	Err string `json:"error,omitempty"`
}

// ErrorSample is one distinct error message.
type ErrorSample struct {
	Class ErrorClass `json:"class"`
	Msg   string     `json:"message"`
	Count int        `json:"count"`
}

func buildReport(cfg Config, started time.Time, ts []*target, ms []measurement) *Report {
	rep := &Report{Settings: settingsOf(cfg), Started: started}
	for i, m := range ms {
		t := ts[i]
		tr := summarizeTarget(m.results, m.wall)
		tr.Role, tr.URL, tr.Protocol = t.role, t.url, t.protocol
		tr.CPU, tr.GeneratorCPU = cpuUsage(m), usage1k(0, m.genCPU, m.allTokens)
		if m.genCPUErr {
			tr.GeneratorCPU = CPUUsage{Err: "reading /proc/self/stat failed (out of file descriptors?)"}
		}
		rep.Targets = append(rep.Targets, tr)
		rep.Results = append(rep.Results, m.results...)
	}
	if len(rep.Targets) == 2 {
		rep.Comparison = compareTargets(&rep.Targets[0], &rep.Targets[1])
	}
	return rep
}

func settingsOf(cfg Config) Settings {
	wl, _ := newWorkload(cfg) // validated before
	s := Settings{
		Workload: cfg.Workload, PromptTokens: wl.prompt.String(), OutputTokens: wl.output.String(),
		Arrival: "closed", Concurrency: cfg.Concurrency, Requests: cfg.Requests,
		Seed: cfg.Seed, Stream: !cfg.NoStream, Path: cfg.Path, Model: cfg.Model,
	}
	if cfg.Rate > 0 {
		s.Arrival, s.Rate, s.Concurrency = "open", cfg.Rate, 0
	}
	if cfg.Duration > 0 {
		s.Duration = cfg.Duration.String()
	}
	if cfg.Warmup > 0 {
		s.Warmup = cfg.Warmup.String()
	}
	if cfg.Ramp > 0 {
		s.Ramp = cfg.Ramp.String()
	}
	if cfg.Compare != "" {
		s.Rounds = cfg.Rounds
	}
	return s
}

func cpuUsage(m measurement) []CPUUsage {
	var out []CPUUsage
	for pid, d := range m.cpu {
		out = append(out, usage1k(pid, d, m.allTokens))
	}
	for pid, e := range m.cpuErr {
		if _, ok := m.cpu[pid]; !ok {
			out = append(out, CPUUsage{PID: pid, Err: e})
		}
	}
	slices.SortFunc(out, func(a, b CPUUsage) int { return a.PID - b.PID })
	return out
}

func usage1k(pid int, d time.Duration, tokens int64) CPUUsage {
	u := CPUUsage{PID: pid, CPUMs: ms(d)}
	if tokens > 0 {
		u.MsPer1kTokens = u.CPUMs * 1000 / float64(tokens)
	}
	return u
}

// lateAfter is where TokenDelayLate's requests start in their phase.
const lateAfter = 4 * time.Second

// summarizeTarget computes the figures of one target's results.
func summarizeTarget(results []Result, wall time.Duration) TargetReport {
	tr := TargetReport{Wall: wall, WallSeconds: wall.Seconds()}
	var ttft, itl, e2e, lag, delay, first, rest, late []time.Duration
	errs := map[[2]string]int{}
	for i := range results {
		r := &results[i]
		tr.Counts.add(r.Class)
		tr.OutputTokens += int64(r.TokensOut)
		if r.TTFT > 0 {
			ttft = append(ttft, r.TTFT)
		}
		itl = append(itl, r.ITL...)
		delay = append(delay, r.TokenDelay...)
		if len(r.TokenDelay) > 0 {
			first = append(first, r.TokenDelay[0])
			rest = append(rest, r.TokenDelay[1:]...)
		}
		if r.Start >= lateAfter {
			late = append(late, r.TokenDelay...)
		}
		if r.Class == ClassOK {
			e2e = append(e2e, r.E2E)
		}
		if r.Class != ClassDropped {
			lag = append(lag, r.Lag)
		}
		if r.Class != ClassOK {
			errs[[2]string{string(r.Class), r.Err}]++
		}
	}
	tr.TTFT, tr.ITL, tr.E2E, tr.DispatchLag = Summarize(ttft), Summarize(itl), Summarize(e2e), Summarize(lag)
	tr.TokenDelay = Summarize(delay)
	tr.TokenDelayFirst, tr.TokenDelayRest = Summarize(first), Summarize(rest)
	tr.TokenDelayLate = Summarize(late)
	if s := wall.Seconds(); s > 0 {
		tr.RequestsPerSec = float64(tr.Counts.OK) / s
		tr.OutputTokensPerSec = float64(tr.OutputTokens) / s
	}
	tr.Stages = stageSplit(results)
	tr.Errors = topErrors(errs, 5)
	return tr
}

func topErrors(errs map[[2]string]int, n int) []ErrorSample {
	var out []ErrorSample
	for k, c := range errs {
		out = append(out, ErrorSample{Class: ErrorClass(k[0]), Msg: k[1], Count: c})
	}
	slices.SortFunc(out, func(a, b ErrorSample) int {
		if a.Count != b.Count {
			return b.Count - a.Count
		}
		return cmp.Compare(string(a.Class)+a.Msg, string(b.Class)+b.Msg)
	})
	return out[:min(n, len(out))]
}

// stageOrder is the order in which known Server-Timing metrics are shown:
// the proxy's header stages, then its trailer.
var stageOrder = []string{"net-rtt", "tls", "recv", "auth", "queue", "route", "upstream", "prefill",
	"ttft", "edge", "hold", "decode", "itl-p50", "itl-p99", "itl-max", "tokens", "tps"}

// stageSplit gathers each Server-Timing metric across requests (first
// occurrence per request) and derives network = client TTFT − server ttft.
func stageSplit(results []Result) []Stage {
	vals := map[string][]float64{}
	var network []float64
	for i := range results {
		r := &results[i]
		seen := map[string]bool{}
		for _, m := range r.Timing {
			if v, ok := m.Value(); ok && !seen[m.Name] {
				seen[m.Name] = true
				vals[m.Name] = append(vals[m.Name], v)
			}
		}
		if st, ok := Lookup(r.Timing, "ttft"); ok && r.TTFT > 0 {
			network = append(network, ms(r.TTFT)-st)
		}
	}
	var out []Stage
	if len(network) > 0 {
		out = append(out, summarizeStage("network", "ms", network))
	}
	for _, name := range stageOrder {
		if v, ok := vals[name]; ok {
			out = append(out, summarizeStage(name, unitOf(name), v))
			delete(vals, name)
		}
	}
	rest := make([]string, 0, len(vals))
	for name := range vals {
		rest = append(rest, name)
	}
	slices.Sort(rest)
	for _, name := range rest {
		out = append(out, summarizeStage(name, unitOf(name), vals[name]))
	}
	return out
}

func unitOf(name string) string {
	if name == "tokens" || name == "tps" {
		return ""
	}
	return "ms"
}

// String is a one-line summary of the target's headline figures.
func (t *TargetReport) String() string {
	return fmt.Sprintf("%s %s: %d ok of %d, %.1f req/s, %.0f tok/s, ttft p95 %s, itl p95 %s, truncated %d",
		t.Role, t.URL, t.Counts.OK, t.Counts.Sent, t.RequestsPerSec, t.OutputTokensPerSec,
		fmtMs(t.TTFT.P95), fmtMs(t.ITL.P95), t.Counts.Truncated)
}

func fmtMs(d time.Duration) string { return fmt.Sprintf("%.2fms", ms(d)) }
