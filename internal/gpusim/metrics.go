package gpusim

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Bucket boundaries, in seconds, after vLLM's (v1 engine) with a few finer
// ones at the low end for fast simulated steps.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
		0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}
	itlBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
		0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	requestBuckets = []float64{0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15,
		20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}
)

// metrics are one Sim's Prometheus metrics, in their own registry, named
// as vLLM names them and labelled with model_name.
type metrics struct {
	handler                        http.Handler
	ttft, itl, e2e, queue, prefill prometheus.Histogram
	decode                         prometheus.Histogram
	promptTokens, genTokens        prometheus.Counter
	// prefixQueries and prefixHits count prompt tokens looked up in the
	// prefix cache and found there (vLLM v0.11, vllm/v1/metrics/loggers.py:
	// vllm:prefix_cache_queries and vllm:prefix_cache_hits, exposed with
	// the _total suffix by prometheus_client).
	prefixQueries, prefixHits prometheus.Counter
	success                   *prometheus.CounterVec
}

func newMetrics(s *Sim) *metrics {
	reg := prometheus.NewRegistry()
	labels := prometheus.Labels{"model_name": s.cfg.Model}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: name, Help: help, ConstLabels: labels, Buckets: buckets,
		})
		reg.MustRegister(h)
		return h
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
		reg.MustRegister(c)
		return c
	}
	gauge := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: name, Help: help, ConstLabels: labels,
		}, f))
	}
	running := func() float64 { return float64(s.running.Load()) }
	waiting := func() float64 { return float64(s.waiting.Load()) }
	switch s.cfg.MetricNames {
	case MetricsSGLang: // SGLang v0.4.6, python/sglang/srt/metrics/collector.py
		gauge("sglang:num_running_reqs", "The number of running requests.", running)
		gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", waiting)
		gauge("sglang:token_usage", "The token usage.", s.kvUsage)
	case MetricsTGI: // TGI v3.3: unlabelled gauges, no KV-cache gauge
		for _, g := range []struct {
			name string
			f    func() float64
		}{{"tgi_batch_current_size", running}, {"tgi_queue_size", waiting}} {
			reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: g.name, Help: g.name}, g.f))
		}
	case MetricsVLLMV0: // vLLM v0.6.3, vllm/engine/metrics.py
		gauge("vllm:num_requests_running", "Number of requests currently running on GPU.", running)
		gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.", func() float64 { return 0 })
		gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting)
		gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", s.kvUsage)
	default: // vLLM v0.11 (V1 engine), vllm/v1/metrics/loggers.py
		gauge("vllm:num_requests_running", "Number of requests in model execution batches.", running)
		gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting)
		gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.kvUsage)
	}
	m := &metrics{
		handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		ttft: hist("vllm:time_to_first_token_seconds",
			"Histogram of time to first token in seconds.", ttftBuckets),
		itl: hist("vllm:inter_token_latency_seconds",
			"Histogram of inter-token latency in seconds.", itlBuckets),
		e2e: hist("vllm:e2e_request_latency_seconds",
			"Histogram of end to end request latency in seconds.", requestBuckets),
		queue: hist("vllm:request_queue_time_seconds",
			"Histogram of time spent in WAITING phase for request.", requestBuckets),
		prefill: hist("vllm:request_prefill_time_seconds",
			"Histogram of time spent in PREFILL phase for request.", requestBuckets),
		decode: hist("vllm:request_decode_time_seconds",
			"Histogram of time spent in DECODE phase for request.", requestBuckets),
		promptTokens: counter("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		genTokens:    counter("vllm:generation_tokens_total", "Number of generation tokens processed."),
		success: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vllm:request_success_total", Help: "Count of finished requests by finish reason.",
			ConstLabels: labels,
		}, []string{"finished_reason"}),
	}
	reg.MustRegister(m.success)
	m.prefixQueries = counter("vllm:prefix_cache_queries_total",
		"Prefix cache queries, in terms of number of queried tokens.")
	m.prefixHits = counter("vllm:prefix_cache_hits_total",
		"Prefix cache hits, in terms of number of cached tokens.")
	return m
}

// kvUsage is the fraction of the KV cache held by running sequences.
func (s *Sim) kvUsage() float64 {
	return min(1, float64(s.kvHeld.Load())/float64(s.cfg.KVCacheTokens))
}

// setLoadHeader answers an ORCA load-report request as vLLM v0.11 does
// (vllm/entrypoints/openai/orca_metrics.py, api_server.py): when the
// request carries "endpoint-load-metrics-format: TEXT" or "JSON" (any
// case), a non-streamed successful chat or completions response gets an
// endpoint-load-metrics header with the named metrics vLLM maps from its
// gauges, num_requests_waiting and kv_cache_usage_perc (no running count),
// as Python prints floats:
//
//	TEXT named_metrics.num_requests_waiting=2.0, named_metrics.kv_cache_usage_perc=0.25
//	JSON {"named_metrics": {"num_requests_waiting": 2.0, "kv_cache_usage_perc": 0.25}}
//
// Streams, errors and other endpoints get none, nor does a Sim without
// Config.LoadHeader or one that names SGLang or TGI metrics (those engines
// send no load header).
func (s *Sim) setLoadHeader(h http.Header, r *http.Request) {
	if !s.cfg.LoadHeader || s.cfg.MetricNames == MetricsSGLang || s.cfg.MetricNames == MetricsTGI {
		return
	}
	f := r.Header.Get("Endpoint-Load-Metrics-Format")
	text := strings.EqualFold(f, "text")
	if !text && !strings.EqualFold(f, "json") {
		return
	}
	w, kv := pyFloat(float64(s.waiting.Load())), pyFloat(s.kvUsage())
	if text {
		h.Set("Endpoint-Load-Metrics", "TEXT named_metrics.num_requests_waiting="+w+", named_metrics.kv_cache_usage_perc="+kv)
	} else {
		h.Set("Endpoint-Load-Metrics", `JSON {"named_metrics": {"num_requests_waiting": `+w+`, "kv_cache_usage_perc": `+kv+`}}`)
	}
}

// pyFloat formats f as Python's repr of a float does: the shortest form
// that reads back, with ".0" on integral values and an exponent below 1e-4
// or from 1e16.
func pyFloat(f float64) string {
	if f != 0 && (f < 1e-4 && f > -1e-4 || f >= 1e16 || f <= -1e16) {
		s := strconv.FormatFloat(f, 'e', -1, 64) // 1e-05 as Python, not 1e-5
		if i := strings.IndexByte(s, 'e'); i >= 0 && len(s)-i == 3 {
			s = s[:i+2] + "0" + s[i+2:]
		}
		return s
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsRune(s, '.') {
		s += ".0"
	}
	return s
}
