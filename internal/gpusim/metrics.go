package gpusim

import (
	"net/http"

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
	success                        *prometheus.CounterVec
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
	gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
		func() float64 { return float64(s.running.Load()) })
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
		func() float64 { return float64(s.waiting.Load()) })
	gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
		s.kvUsage)
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
	return m
}

// kvUsage is the fraction of the KV cache held by running sequences.
func (s *Sim) kvUsage() float64 {
	return min(1, float64(s.kvHeld.Load())/float64(s.cfg.KVCacheTokens))
}
