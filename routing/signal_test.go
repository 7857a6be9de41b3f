package routing

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/gpusim"
)

func TestParseLoadHeader(t *testing.T) {
	cases := []struct {
		in       string
		ok       bool
		w, r, kv float64
	}{
		{"TEXT named_metrics.num_requests_waiting=3, named_metrics.num_requests_running=5, named_metrics.kv_cache_usage_perc=0.2500", true, 3, 5, 0.25},
		{"TEXT num_requests_waiting=1,num_requests_running=2", true, 1, 2, -1},
		{"TEXT cpu_utilization=0.5, named_metrics.num_queue_reqs=4, named_metrics.num_running_reqs=6, rps_fractional=10", true, 4, 6, -1},
		{`JSON {"cpu_utilization":0.1,"named_metrics":{"num_requests_waiting":2,"num_requests_running":7,"kv_cache_utilization":0.5}}`, true, 2, 7, 0.5},
		{"TEXT named_metrics.num_requests_waiting=3", true, 3, -1, -1},                        // partial, as vLLM sends
		{"text named_metrics.num_requests_running=4, named_metrics.foo=bar", true, -1, 4, -1}, // any case; unknown keys' values ignored
		{`JSON {"named_metrics": {"num_requests_waiting": 3.0, "kv_cache_usage_perc": 0.5}}`, true, 3, -1, 0.5},
		{"TEXT named_metrics.kv_cache_usage_perc=0.5", false, 0, 0, 0},                        // neither count
		{"TEXT named_metrics.num_requests_waiting=x, num_requests_running=1", false, 0, 0, 0}, // bad number
		{"TEXT num_requests_waiting=-1, num_requests_running=1", false, 0, 0, 0},
		{"TEXT num_requests_waiting=NaN, num_requests_running=1", false, 0, 0, 0},
		{"TEXT garbage", false, 0, 0, 0},
		{"BIN AAAA", false, 0, 0, 0},
		{"", false, 0, 0, 0},
		{`JSON {"named_metrics":`, false, 0, 0, 0},
	}
	for _, tc := range cases {
		s, ok := parseLoadHeader(tc.in)
		if ok != tc.ok || ok && (s.Waiting != tc.w || s.Running != tc.r || s.KVCache != tc.kv || s.Source != SourceHeader) {
			t.Errorf("parseLoadHeader(%q) = %+v, %v; want ok=%v w=%v r=%v kv=%v", tc.in, s, ok, tc.ok, tc.w, tc.r, tc.kv)
		}
	}
}

// The simulator's own header reads back as a sample.
func TestLoadHeaderFromSimulator(t *testing.T) {
	sim := gpusim.New(gpusim.Config{LoadHeader: true, PrefillBase: -1, StepBase: 5e6, DefaultMaxTokens: 2})
	srv := httptest.NewServer(sim)
	defer func() { srv.Close(); sim.Close() }()
	req, _ := http.NewRequest("POST", srv.URL+"/v1/completions", strings.NewReader(`{"model":"sim-small","prompt":"hi"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Endpoint-Load-Metrics-Format", "TEXT")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	h := resp.Header.Get("Endpoint-Load-Metrics")
	if _, ok := parseLoadHeader(h); !ok {
		t.Fatalf("simulator header %q did not parse", h)
	}
}

func FuzzParseLoadHeader(f *testing.F) {
	f.Add("TEXT named_metrics.num_requests_waiting=3, named_metrics.num_requests_running=5")
	f.Add(`JSON {"named_metrics":{"num_requests_waiting":2,"num_requests_running":1}}`)
	f.Fuzz(func(t *testing.T, v string) {
		s, ok := parseLoadHeader(v)
		if ok && (s.Waiting < 0 && s.Running < 0 || s.KVCache > 1) {
			t.Fatalf("parseLoadHeader(%q) = %+v", v, s)
		}
	})
}

// The per-response cost of a load header: parse and store.
func BenchmarkObserveLoadHeader(b *testing.B) {
	p, _ := NewPool(quiet("http://127.0.0.1:1"))
	be := p.Backends()[0]
	for _, h := range []string{
		"TEXT named_metrics.num_requests_waiting=3.0, named_metrics.num_requests_running=5.0, named_metrics.kv_cache_usage_perc=0.25",
		`JSON {"named_metrics": {"num_requests_waiting": 3.0, "num_requests_running": 5.0, "kv_cache_usage_perc": 0.25}}`,
	} {
		b.Run(h[:4], func(b *testing.B) {
			b.ReportAllocs()
			now := time.Now()
			for b.Loop() {
				be.observeLoadHeader(h, now)
			}
		})
	}
}
