package gpusim

import (
	"context"
	"encoding/json"
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

// The load header follows vLLM v0.11 (vllm/entrypoints/openai/
// orca_metrics.py, api_server.py): only when the request asks, in the
// format asked (any case), only on a non-streamed successful response,
// with num_requests_waiting and kv_cache_usage_perc as Python prints them.
func TestLoadHeader(t *testing.T) {
	cfg := fast()
	cfg.LoadHeader = true
	cfg.MaxBatch = 1
	cfg.StepBase = 5 * time.Millisecond
	s, url := startSim(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 3 {
		resp := post(t, ctx, url, "/v1/completions", `{"prompt":"x","max_tokens":1000,"stream":true}`,
			"Endpoint-Load-Metrics-Format", "TEXT")
		defer resp.Body.Close()
		if h := resp.Header.Get("Endpoint-Load-Metrics"); h != "" {
			t.Errorf("stream got load header %q; vLLM sends none on streams", h)
		}
	}
	eventually(t, "1 running, 2 waiting", func() bool { st := s.Stats(); return st.Running == 1 && st.Waiting == 2 })
	// The fourth request queues behind the three and reports the queue
	// it leaves: 2 still waiting.
	get := func(format string, hdr ...string) string {
		t.Helper()
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp := post(t, c, url, "/v1/completions", `{"prompt":"x","max_tokens":1}`,
			append([]string{"Endpoint-Load-Metrics-Format", format}, hdr...)...)
		resp.Body.Close()
		return resp.Header.Get("Endpoint-Load-Metrics")
	}
	cancel() // free the batch so the next requests run
	eventually(t, "idle", func() bool { st := s.Stats(); return st.Running == 0 && st.Waiting == 0 })
	for _, tc := range []struct{ format, want string }{
		{"TEXT", "TEXT named_metrics.num_requests_waiting=0.0, named_metrics.kv_cache_usage_perc=@"},
		{"text", "TEXT named_metrics.num_requests_waiting=0.0, named_metrics.kv_cache_usage_perc=@"},
		{"JSON", `JSON {"named_metrics": {"num_requests_waiting": 0.0, "kv_cache_usage_perc": @}}`},
		{"BIN", ""},
		{"", ""},
	} {
		// @ is the KV usage, which may still hold the request's own few
		// tokens when the body is written.
		got := get(tc.format)
		pre, post, _ := strings.Cut(tc.want, "@")
		kv, ok := strings.CutPrefix(got, pre)
		if ok {
			kv, ok = strings.CutSuffix(kv, post)
		}
		if f, err := strconv.ParseFloat(kv, 64); tc.want == "" && got != "" || tc.want != "" && (!ok || err != nil || f < 0 || f > 0.01) {
			t.Errorf("format %q: header %q; want %q", tc.format, got, tc.want)
		}
	}
	if got := get("TEXT", HeaderFail, "before-first"); got != "" {
		t.Errorf("error response got load header %q", got)
	}

	_, plain := startSim(t, fast())
	resp := post(t, context.Background(), plain, "/v1/completions", `{"prompt":"x","max_tokens":1}`,
		"Endpoint-Load-Metrics-Format", "TEXT")
	resp.Body.Close()
	if h := resp.Header.Get("Endpoint-Load-Metrics"); h != "" {
		t.Errorf("load header %q without LoadHeader", h)
	}
}

// Under load, the header's queue and KV-cache usage are the gauges'.
func TestLoadHeaderUnderLoad(t *testing.T) {
	cfg := fast()
	cfg.LoadHeader = true
	cfg.MaxBatch = 1
	cfg.StepBase = 5 * time.Millisecond
	s, url := startSim(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := post(t, ctx, url, "/v1/completions", `{"prompt":"x","max_tokens":1000,"stream":true}`)
	defer resp.Body.Close()
	eventually(t, "1 running", func() bool { return s.Stats().Running == 1 })
	// Queued behind the stream with a second one; stop the stream once
	// both wait so they finish while one is still counted waiting.
	done := make(chan string, 2)
	for range 2 {
		go func() {
			r, err := http.DefaultClient.Do(mustReq(url, "JSON"))
			if err != nil {
				done <- "error: " + err.Error()
				return
			}
			r.Body.Close()
			done <- r.Header.Get("Endpoint-Load-Metrics")
		}()
	}
	eventually(t, "2 waiting", func() bool { return s.Stats().Waiting == 2 })
	cancel()
	var got []string
	for range 2 {
		got = append(got, <-done)
	}
	// The first to finish still sees the other waiting or running; its
	// header parses, carries a waiting count and a KV usage in [0, 1].
	for _, h := range got {
		var body struct {
			NamedMetrics map[string]float64 `json:"named_metrics"`
		}
		rest, ok := strings.CutPrefix(h, "JSON ")
		if !ok || json.Unmarshal([]byte(rest), &body) != nil {
			t.Fatalf("header %q is not vLLM's JSON form", h)
		}
		w, okW := body.NamedMetrics["num_requests_waiting"]
		kv, okKV := body.NamedMetrics["kv_cache_usage_perc"]
		if !okW || !okKV || len(body.NamedMetrics) != 2 || w < 0 || w > 1 || kv < 0 || kv > 1 {
			t.Errorf("header %q; want num_requests_waiting in [0, 1] and kv_cache_usage_perc only", h)
		}
	}
}

func mustReq(url, format string) *http.Request {
	req, err := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(`{"prompt":"x","max_tokens":2}`))
	if err != nil {
		panic(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Endpoint-Load-Metrics-Format", format)
	return req
}

func TestPyFloat(t *testing.T) {
	for f, want := range map[float64]string{0: "0.0", 3: "3.0", 0.25: "0.25", 0.4127604166666667: "0.4127604166666667",
		1e-05: "1e-05", 0.0001: "0.0001", 1: "1.0", 123456: "123456.0", 1e16: "1e+16"} {
		if got := pyFloat(f); got != want {
			t.Errorf("pyFloat(%v) = %q; want %q (Python repr)", f, got, want)
		}
	}
}

// /metrics names the load gauges as the selected engine does.
func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		names      string
		want, gone []string
	}{
		{"", []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"}, []string{"vllm:gpu_cache_usage_perc"}},
		{"vllm-v0", []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc", "vllm:num_requests_swapped"}, []string{"vllm:kv_cache_usage_perc"}},
		{"sglang", []string{"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"}, []string{"vllm:num_requests_running", "vllm:kv_cache_usage_perc"}},
		{"tgi", []string{"tgi_queue_size", "tgi_batch_current_size"}, []string{"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"}},
	} {
		cfg := fast()
		cfg.MetricNames = tc.names
		_, url := startSim(t, cfg)
		fams := scrape(t, url)
		for _, n := range tc.want {
			if _, ok := fams[n]; !ok {
				t.Errorf("metric_names %q: no %s", tc.names, n)
			}
		}
		for _, n := range tc.gone {
			if _, ok := fams[n]; ok {
				t.Errorf("metric_names %q: has %s", tc.names, n)
			}
		}
	}
	if err := (Config{MetricNames: "llamacpp"}).Validate(); err == nil || !strings.Contains(err.Error(), "metric_names") {
		t.Errorf("Validate(metric_names llamacpp) = %v", err)
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
