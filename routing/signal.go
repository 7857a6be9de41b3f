package routing

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Sources of a Sample.
const (
	SourceScrape = "scrape"
	SourceHeader = "header"
)

// Sample is one reading of a backend engine's load.
type Sample struct {
	// At is when the reading was taken (for a scrape, when the request was
	// sent, so that its age is never understated).
	At time.Time
	// Waiting and Running are the engine's queued and running requests,
	// summed over all label sets (models, data-parallel engines).
	Waiting, Running float64
	// KVCache is the KV-cache usage in [0, 1] (the largest over label
	// sets); negative when the engine does not report it.
	KVCache float64
	// Source is SourceScrape or SourceHeader.
	Source string
	// Dialect is the metric dialect the reading was in ("vllm", "sglang",
	// "tgi"); empty for header readings.
	Dialect string

	// inflight is this node's in-flight requests to the backend at At:
	// the load estimate adds the change since then.
	inflight int64
}

// errNoGauges means an exposition has none of the dialect's load gauges.
var errNoGauges = errors.New("no load gauges of a known engine in the metrics")

// dialectNames are the gauge names of one engine's metrics.
type dialectNames struct {
	name                 string
	waiting, running, kv []string
}

var dialectTable = [...]dialectNames{
	{DialectVLLM, []string{"vllm:num_requests_waiting"}, []string{"vllm:num_requests_running"},
		[]string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}},
	{DialectSGLang, []string{"sglang:num_queue_reqs", "sglang_num_queue_reqs"},
		[]string{"sglang:num_running_reqs", "sglang_num_running_reqs"},
		[]string{"sglang:token_usage", "sglang_token_usage"}},
	{DialectTGI, []string{"tgi_queue_size"}, []string{"tgi_batch_current_size"}, nil},
}

// gaugeSums accumulates one dialect's gauges over an exposition.
type gaugeSums struct {
	waiting, running, kv float64
	hasW, hasR, hasKV    bool
	bad                  bool // a negative or non-finite count
}

func (g *gaugeSums) add(d *dialectNames, name []byte, v float64) {
	switch {
	case matchAny(d.waiting, name):
		g.waiting += v
		g.hasW = true
	case matchAny(d.running, name):
		g.running += v
		g.hasR = true
	case matchAny(d.kv, name):
		if !g.hasKV || v > g.kv {
			g.kv = v
		}
		g.hasKV = true
		return
	default:
		return
	}
	if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		g.bad = true
	}
}

func matchAny(names []string, name []byte) bool {
	for _, n := range names {
		if string(name) == n {
			return true
		}
	}
	return false
}

// parseGauges reads the load gauges of an engine's Prometheus text
// exposition. dialect "auto" takes the first of vLLM, SGLang and TGI whose
// waiting and running gauges are both present.
func parseGauges(data []byte, dialect string) (Sample, error) {
	var sums [len(dialectTable)]gaugeSums
	err := scanExposition(data, func(name []byte, v float64) {
		for i := range dialectTable {
			if dialect == DialectAuto || dialect == dialectTable[i].name {
				sums[i].add(&dialectTable[i], name, v)
			}
		}
	})
	if err != nil {
		return Sample{}, fmt.Errorf("parsing metrics: %w", err)
	}
	for i, g := range sums {
		if !g.hasW || !g.hasR {
			continue
		}
		if g.bad {
			return Sample{}, fmt.Errorf("parsing metrics: %s load gauges are negative or not finite", dialectTable[i].name)
		}
		s := Sample{Waiting: g.waiting, Running: g.running, KVCache: -1, Dialect: dialectTable[i].name, Source: SourceScrape}
		if g.hasKV && !math.IsNaN(g.kv) {
			s.KVCache = min(max(g.kv, 0), 1)
		}
		return s, nil
	}
	return Sample{}, errNoGauges
}

// Keys of the endpoint-load-metrics header, with or without the
// "named_metrics." prefix. vLLM (v0.11, vllm/entrypoints/openai/
// orca_metrics.py) reports kv_cache_usage_perc and num_requests_waiting
// only; the others are the names SGLang and TGI give the same gauges, for
// engines or sidecars that report them.
var (
	headerWaiting = []string{"num_requests_waiting", "num_queue_reqs", "queue_size"}
	headerRunning = []string{"num_requests_running", "num_running_reqs", "batch_current_size"}
	headerKV      = []string{"kv_cache_usage_perc", "kv_cache_utilization", "gpu_cache_usage_perc", "token_usage"}
)

// orcaJSON is the JSON form's body; fields start NaN so that absent ones
// are told apart (JSON has no NaN).
type orcaJSON struct {
	NamedMetrics struct {
		W0 float64 `json:"num_requests_waiting"`
		W1 float64 `json:"num_queue_reqs"`
		W2 float64 `json:"queue_size"`
		R0 float64 `json:"num_requests_running"`
		R1 float64 `json:"num_running_reqs"`
		R2 float64 `json:"batch_current_size"`
		K0 float64 `json:"kv_cache_usage_perc"`
		K1 float64 `json:"kv_cache_utilization"`
		K2 float64 `json:"gpu_cache_usage_perc"`
		K3 float64 `json:"token_usage"`
	} `json:"named_metrics"`
}

// parseLoadHeader reads an ORCA endpoint-load-metrics header in its TEXT
// form ("TEXT named_metrics.num_requests_waiting=2.0, …") or JSON form
// ("JSON {"named_metrics": {…}}"), the two forms vLLM v0.11 emits (the
// format word in any case). Keys it does not know are ignored. A report may
// be partial: Waiting and Running are negative when the header does not
// carry them (vLLM sends no running count), KVCache likewise; it is
// refused (ok false) when it carries neither count, or a known key's value
// is not a finite non-negative number. The TEXT form allocates nothing.
func parseLoadHeader(v string) (s Sample, ok bool) {
	s = Sample{Waiting: -1, Running: -1, KVCache: -1, Source: SourceHeader}
	set := func(key string, f float64) bool {
		key = strings.TrimPrefix(key, "named_metrics.")
		var dst *float64
		switch {
		case contains(headerWaiting, key):
			dst = &s.Waiting
		case contains(headerRunning, key):
			dst = &s.Running
		case contains(headerKV, key):
			dst = &s.KVCache
		default:
			return true
		}
		if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
			return false
		}
		if dst == &s.KVCache {
			f = min(f, 1)
		}
		*dst = f
		return true
	}
	v = strings.TrimSpace(v)
	if len(v) < 5 || v[4] != ' ' {
		return Sample{}, false
	}
	switch body := v[5:]; {
	case strings.EqualFold(v[:4], "TEXT"):
		for body != "" {
			var kv string
			kv, body, _ = strings.Cut(body, ",")
			key, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if !ok {
				return Sample{}, false
			}
			key = strings.TrimSpace(key)
			f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
			if err != nil {
				if known(key) {
					return Sample{}, false
				}
				continue
			}
			if !set(key, f) {
				return Sample{}, false
			}
		}
	case strings.EqualFold(v[:4], "JSON"):
		var j orcaJSON
		nm := &j.NamedMetrics
		vals := [...]*float64{&nm.W0, &nm.W1, &nm.W2, &nm.R0, &nm.R1, &nm.R2, &nm.K0, &nm.K1, &nm.K2, &nm.K3}
		for _, p := range vals {
			*p = math.NaN()
		}
		if json.Unmarshal([]byte(body), &j) != nil {
			return Sample{}, false
		}
		keys := [...]string{"num_requests_waiting", "num_requests_waiting", "num_requests_waiting",
			"num_requests_running", "num_requests_running", "num_requests_running",
			"kv_cache_usage_perc", "kv_cache_usage_perc", "kv_cache_usage_perc", "kv_cache_usage_perc"}
		for i, p := range vals {
			if !math.IsNaN(*p) && !set(keys[i], *p) {
				return Sample{}, false
			}
		}
	default:
		return Sample{}, false
	}
	return s, s.Waiting >= 0 || s.Running >= 0
}

func known(key string) bool {
	key = strings.TrimPrefix(key, "named_metrics.")
	return contains(headerWaiting, key) || contains(headerRunning, key) || contains(headerKV, key)
}

// complete fills what a partial header report h, received at t with in
// requests of this node in flight, does not carry, so that the stored
// sample has both counts (the combination rule of docs/CONFIG.md):
//   - KV-cache usage: the fresh scrape's, else unknown.
//   - Waiting: the fresh scrape's, else 0.
//   - Running: with max_batch known and a queue reported, max_batch (an
//     engine queues only once its batch is full); otherwise the larger of
//     the fresh scrape's running count moved by this node's dispatches
//     since that scrape, and this node's in-flight requests less the queue
//     (those of them not waiting run); at most max_batch when known.
//
// A scrape is fresh when younger than the pool's stale_after at t.
func (b *Backend) complete(h *Sample, t time.Time, in int64) {
	sc := b.scraped.Load()
	if sc != nil && t.Sub(sc.At) > b.pool.cfg.StaleAfter {
		sc = nil
	}
	if h.KVCache < 0 && sc != nil {
		h.KVCache = sc.KVCache
	}
	if h.Waiting < 0 {
		h.Waiting = 0
		if sc != nil {
			h.Waiting = sc.Waiting
		}
	}
	if h.Running >= 0 {
		return
	}
	slots := float64(b.Config.MaxBatch)
	if slots > 0 && h.Waiting > 0 {
		h.Running = slots
		return
	}
	r := max(float64(in)-h.Waiting, 0)
	if sc != nil {
		r = max(r, sc.Running+float64(in-sc.inflight))
	}
	if slots > 0 {
		r = min(r, slots)
	}
	h.Running = r
}
