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
// "named_metrics." prefix.
var (
	headerWaiting = []string{"num_requests_waiting", "num_queue_reqs", "queue_size"}
	headerRunning = []string{"num_requests_running", "num_running_reqs", "batch_current_size"}
	headerKV      = []string{"kv_cache_usage_perc", "kv_cache_utilization", "gpu_cache_usage_perc", "token_usage"}
)

// parseLoadHeader reads an ORCA endpoint-load-metrics header in its TEXT
// form ("TEXT named_metrics.num_requests_waiting=2, …") or JSON form
// ("JSON {"named_metrics": {…}}"). Keys it does not know are ignored; the
// waiting and running counts are required.
func parseLoadHeader(v string) (Sample, bool) {
	s := Sample{KVCache: -1, Source: SourceHeader}
	var hasW, hasR bool
	set := func(key string, f float64) bool {
		key = strings.TrimPrefix(key, "named_metrics.")
		if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
			return false
		}
		switch {
		case contains(headerWaiting, key):
			s.Waiting, hasW = f, true
		case contains(headerRunning, key):
			s.Running, hasR = f, true
		case contains(headerKV, key):
			s.KVCache = min(f, 1)
		}
		return true
	}
	v = strings.TrimSpace(v)
	switch {
	case strings.HasPrefix(v, "TEXT "):
		for _, kv := range strings.Split(v[len("TEXT "):], ",") {
			key, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if !ok {
				return Sample{}, false
			}
			f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
			if err != nil || !set(strings.TrimSpace(key), f) {
				return Sample{}, false
			}
		}
	case strings.HasPrefix(v, "JSON "):
		var body struct {
			NamedMetrics map[string]float64 `json:"named_metrics"`
		}
		if json.Unmarshal([]byte(v[len("JSON "):]), &body) != nil {
			return Sample{}, false
		}
		for k, f := range body.NamedMetrics {
			if !set(k, f) {
				return Sample{}, false
			}
		}
	default:
		return Sample{}, false
	}
	return s, hasW && hasR
}
