package gpusim

import (
	"context"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape fetches and strictly parses url's /metrics.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Errorf("metrics Content-Type %q; want the text format", resp.Header.Get("Content-Type"))
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing metrics: %v", err)
	}
	return fams
}

// sample returns the one sample of name, checking its model_name label.
func sample(t *testing.T, fams map[string]*dto.MetricFamily, name, modelName string) *dto.Metric {
	t.Helper()
	f, ok := fams[name]
	if !ok || len(f.Metric) != 1 {
		t.Fatalf("metric %s: want one sample, got %v", name, f)
	}
	m := f.Metric[0]
	if len(m.Label) != 1 || m.Label[0].GetName() != "model_name" || m.Label[0].GetValue() != modelName {
		t.Errorf("metric %s labels %v; want model_name=%q", name, m.Label, modelName)
	}
	return m
}

func TestMetricsReflectLoad(t *testing.T) {
	cfg := fast()
	cfg.Model = "m-load"
	cfg.MaxBatch = 2
	cfg.StepBase = 5 * time.Millisecond
	cfg.KVCacheTokens = 1000
	s, url := startSim(t, cfg)
	_, other := startSim(t, Config{Model: "m-idle"}) // independent registry

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 4 {
		resp := post(t, ctx, url, "/v1/completions", `{"prompt":"`+strings.Repeat("x", 400)+`","max_tokens":300,"stream":true}`)
		defer resp.Body.Close()
		go io.Copy(io.Discard, resp.Body) //nolint:errcheck // ends with the response
	}
	eventually(t, "2 running, 2 waiting", func() bool {
		st := s.Stats()
		return st.Running == 2 && st.Waiting == 2
	})
	// Two decode steps: the first step's tokens are published to the KV
	// gauge before the second step counts its own.
	eventually(t, "two decode steps", func() bool {
		return sample(t, scrape(t, url), "vllm:generation_tokens_total", "m-load").GetCounter().GetValue() >= 4
	})
	fams := scrape(t, url)
	if v := sample(t, fams, "vllm:num_requests_running", "m-load").GetGauge().GetValue(); v != 2 {
		t.Errorf("num_requests_running %v; want 2", v)
	}
	if v := sample(t, fams, "vllm:num_requests_waiting", "m-load").GetGauge().GetValue(); v != 2 {
		t.Errorf("num_requests_waiting %v; want 2", v)
	}
	// Two sequences hold 100 prompt tokens each plus a few generated.
	if v := sample(t, fams, "vllm:kv_cache_usage_perc", "m-load").GetGauge().GetValue(); v <= 0.2 || v > 0.8 {
		t.Errorf("kv_cache_usage_perc %v; want a fraction above 0.2 and below 0.8", v)
	}
	if v := sample(t, fams, "vllm:prompt_tokens_total", "m-load").GetCounter().GetValue(); v != 200 {
		t.Errorf("prompt_tokens_total %v; want 200 (two admitted prompts)", v)
	}
	idle := scrape(t, other)
	if v := sample(t, idle, "vllm:num_requests_running", "m-idle").GetGauge().GetValue(); v != 0 {
		t.Errorf("the other Sim reports %v running; want 0", v)
	}
	cancel()
	eventually(t, "an idle engine", func() bool { st := s.Stats(); return st.Running == 0 && st.Waiting == 0 })
	fams = scrape(t, url)
	if v := sample(t, fams, "vllm:kv_cache_usage_perc", "m-load").GetGauge().GetValue(); v != 0 {
		t.Errorf("kv_cache_usage_perc %v after cancel; want 0", v)
	}
}

func TestMetricsHistograms(t *testing.T) {
	cfg := fast()
	_, url := startSim(t, cfg)
	for range 3 {
		resp := post(t, context.Background(), url, "/v1/chat/completions", chatBody(4, true, false))
		if _, done, err := readEvents(t, resp.Body); !done || err != nil {
			t.Fatalf("done=%v err=%v", done, err)
		}
		resp.Body.Close()
	}
	fams := scrape(t, url)
	for name, count := range map[string]uint64{
		"vllm:time_to_first_token_seconds":  3,
		"vllm:inter_token_latency_seconds":  9,
		"vllm:e2e_request_latency_seconds":  3,
		"vllm:request_queue_time_seconds":   3,
		"vllm:request_prefill_time_seconds": 3,
		"vllm:request_decode_time_seconds":  3,
	} {
		if fams[name].GetType() != dto.MetricType_HISTOGRAM {
			t.Errorf("%s is %v; want a histogram", name, fams[name].GetType())
			continue
		}
		h := sample(t, fams, name, "sim-small").GetHistogram()
		if h.GetSampleCount() != count {
			t.Errorf("%s count %d; want %d", name, h.GetSampleCount(), count)
		}
		if name == "vllm:time_to_first_token_seconds" && h.GetSampleSum() < 3*(cfg.StepBase+cfg.PrefillBase).Seconds() {
			t.Errorf("%s sum %v; want ≥ 3 × (prefill + step)", name, h.GetSampleSum())
		}
	}
	if v := sample(t, fams, "vllm:generation_tokens_total", "sim-small").GetCounter().GetValue(); v != 12 {
		t.Errorf("generation_tokens_total %v; want 12", v)
	}
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"} {
		if fams[name].GetType() != dto.MetricType_GAUGE {
			t.Errorf("%s is %v; want a gauge", name, fams[name].GetType())
		}
	}
}

func TestLoadHeader(t *testing.T) {
	cfg := fast()
	cfg.LoadHeader = true
	cfg.MaxBatch = 1
	cfg.StepBase = 5 * time.Millisecond
	s, url := startSim(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 3 {
		resp := post(t, ctx, url, "/v1/completions", `{"prompt":"x","max_tokens":1000,"stream":true}`)
		defer resp.Body.Close()
	}
	eventually(t, "1 running, 2 waiting", func() bool { st := s.Stats(); return st.Running == 1 && st.Waiting == 2 })
	resp := post(t, context.Background(), url, "/v1/completions", `{"prompt":"x","max_tokens":1}`, HeaderFail, "before-first")
	resp.Body.Close()
	got := parseLoadHeader(t, resp.Header.Get("Endpoint-Load-Metrics"))
	if got["named_metrics.num_requests_waiting"] != 2 || got["named_metrics.num_requests_running"] != 1 {
		t.Errorf("load header %v; want waiting 2, running 1", got)
	}
	if kv, ok := got["named_metrics.kv_cache_usage_perc"]; !ok || kv <= 0 || kv > 1 {
		t.Errorf("load header %v; want a kv_cache_usage_perc in (0, 1]", got)
	}

	_, plain := startSim(t, fast())
	resp = post(t, context.Background(), plain, "/v1/completions", `{"prompt":"x","max_tokens":1}`)
	resp.Body.Close()
	if h := resp.Header.Get("Endpoint-Load-Metrics"); h != "" {
		t.Errorf("load header %q without LoadHeader", h)
	}
}

// parseLoadHeader parses the ORCA TEXT form "TEXT k=v, k=v".
func parseLoadHeader(t *testing.T, h string) map[string]float64 {
	t.Helper()
	rest, ok := strings.CutPrefix(h, "TEXT ")
	if !ok {
		t.Fatalf("load header %q does not start with TEXT", h)
	}
	out := map[string]float64{}
	for kv := range strings.SplitSeq(rest, ", ") {
		k, v, ok := strings.Cut(kv, "=")
		f, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil || math.IsNaN(f) {
			t.Fatalf("load header %q: bad pair %q", h, kv)
		}
		out[k] = f
	}
	return out
}
