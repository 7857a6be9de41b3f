package routing

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/gpusim"
)

// The scraper reads each engine's /metrics as the engine writes it (fixtures
// in testdata/engines, versions named in its README), in auto-detection and
// with the engine's dialect named.
func TestParseGaugesEngineFixtures(t *testing.T) {
	cases := []struct {
		file, dialect string
		w, r, kv      float64
	}{
		{"vllm-v0.11.metrics.txt", DialectVLLM, 3, 12, 0.4127604166666667},
		{"vllm-v0.11-dp2.metrics.txt", DialectVLLM, 9, 125, 0.97}, // summed over engines; the fullest cache
		{"vllm-v0.6.3.metrics.txt", DialectVLLM, 1, 7, 0.25},      // the older gpu_cache_usage_perc
		{"sglang-v0.4.6.metrics.txt", DialectSGLang, 2826, 162, 0.28},
		{"tgi-v3.3.metrics.txt", DialectTGI, 5, 32, -1}, // TGI has no KV-cache gauge
	}
	for _, tc := range cases {
		data, err := os.ReadFile(filepath.Join("testdata", "engines", tc.file))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range []string{DialectAuto, tc.dialect} {
			s, err := parseGauges(data, d)
			if err != nil {
				t.Errorf("%s (%s): %v", tc.file, d, err)
				continue
			}
			if s.Waiting != tc.w || s.Running != tc.r || s.KVCache != tc.kv || s.Dialect != tc.dialect {
				t.Errorf("%s (%s) = %+v; want %s waiting %v running %v kv %v", tc.file, d, s, tc.dialect, tc.w, tc.r, tc.kv)
			}
		}
		for _, other := range []string{DialectVLLM, DialectSGLang, DialectTGI} {
			if other == tc.dialect {
				continue
			}
			if _, err := parseGauges(data, other); err != errNoGauges {
				t.Errorf("%s read as %s: err %v; want errNoGauges", tc.file, other, err)
			}
		}
	}
}

// vLLM's endpoint-load-metrics values, TEXT and JSON, read as the partial
// reports they are: waiting and KV-cache usage, no running count.
func TestParseLoadHeaderVLLMFixtures(t *testing.T) {
	f, err := os.Open(filepath.Join("testdata", "engines", "vllm-v0.11.headers.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc, n := bufio.NewScanner(f), 0
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "#") || sc.Text() == "" {
			continue
		}
		col := strings.Split(sc.Text(), "\t")
		if len(col) != 5 {
			t.Fatalf("bad fixture line %q", sc.Text())
		}
		var want [3]float64
		for i := range want {
			if want[i], err = strconv.ParseFloat(col[2+i], 64); err != nil {
				t.Fatal(err)
			}
		}
		s, ok := parseLoadHeader(col[1])
		if !ok || s.Waiting != want[0] || s.Running != want[1] || s.KVCache != want[2] {
			t.Errorf("parseLoadHeader(%q) = %+v, %v; want waiting %v running %v kv %v", col[1], s, ok, want[0], want[1], want[2])
		}
		n++
	}
	if n < 6 {
		t.Fatalf("read %d fixture headers", n)
	}
}

// A vLLM header (no running count) completes from the fresh scrape, or
// from this node's in-flight count and max_batch; see complete.
func TestPartialHeaderCombination(t *testing.T) {
	const vllmHdr = "TEXT named_metrics.num_requests_waiting=%s, named_metrics.kv_cache_usage_perc=0.5"
	hdr := func(w string) string { return strings.Replace(vllmHdr, "%s", w, 1) }
	cfg := quiet("http://127.0.0.1:1")
	p, _ := NewPool(cfg)
	b := p.Backends()[0]
	now := time.Now()

	// No scrape: running is this node's in-flight requests not waiting.
	b.inflight.Store(5)
	b.observeLoadHeader(hdr("2.0"), now)
	if l := b.Load(now); !l.Known || l.Sample.Running != 3 || l.Sample.Waiting != 2 || l.KVCache != 0.5 || l.Total != 5 {
		t.Fatalf("no scrape: %+v %+v; want running 3 waiting 2", l, l.Sample)
	}

	// A fresh scrape's running count, moved by dispatches since, wins when larger.
	setSample(b, 0, 40, now) // inflight 5 at the scrape
	b.inflight.Store(7)
	b.observeLoadHeader(hdr("4.0"), now.Add(10*time.Millisecond))
	if l := b.Load(now.Add(10 * time.Millisecond)); l.Sample.Running != 42 || l.Sample.Waiting != 4 || l.Total != 46 {
		t.Fatalf("fresh scrape: %+v %+v; want running 40+2, waiting 4", l, l.Sample)
	}
	// A stale scrape is not used.
	b.observeLoadHeader(hdr("0.0"), now.Add(time.Hour))
	if l := b.Load(now.Add(time.Hour)); l.Sample.Running != 7 {
		t.Fatalf("stale scrape: %+v; want running = in-flight 7", l.Sample)
	}

	// With max_batch, a reported queue means a full batch.
	cfg.Backends[0].MaxBatch = 16
	p, _ = NewPool(cfg)
	b = p.Backends()[0]
	b.observeLoadHeader(hdr("3.0"), now)
	if l := b.Load(now); l.Sample.Running != 16 || l.Waiting != 3 || l.Total != 19 {
		t.Fatalf("max_batch: %+v %+v; want running 16 waiting 3", l, l.Sample)
	}
	// A header with neither count is no sample.
	b.observeLoadHeader("TEXT named_metrics.kv_cache_usage_perc=0.9", now.Add(time.Second))
	if l := b.Load(now.Add(time.Second)); l.KVCache != 0.5 {
		t.Fatalf("kv-only header replaced the sample: %+v", l)
	}
}

// load_header_format: defaults by dialect, explicit choices, and a bad
// value reported on its key.
func TestLoadHeaderFormatConfig(t *testing.T) {
	for _, tc := range []struct{ format, dialect, want string }{
		{"", "", "TEXT"}, {"", DialectVLLM, "TEXT"}, {"", DialectNone, "TEXT"},
		{"", DialectSGLang, ""}, {"", DialectTGI, ""},
		{LoadHeaderJSON, DialectSGLang, "JSON"}, {LoadHeaderText, DialectTGI, "TEXT"}, {LoadHeaderOff, DialectVLLM, ""},
	} {
		pc := quiet("http://127.0.0.1:1")
		pc.LoadHeaderFormat, pc.Dialect = tc.format, tc.dialect
		if errs := pc.WithDefaults().Validate(); len(errs) > 0 {
			t.Fatalf("%+v: %v", tc, errs)
		}
		p, err := NewPool(pc)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Backends()[0].LoadHeaderFormat(); got != tc.want {
			t.Errorf("format %q dialect %q: %q; want %q", tc.format, tc.dialect, got, tc.want)
		}
	}
	pc := quiet("http://127.0.0.1:1")
	pc.LoadHeaderFormat = "BIN"
	errs := pc.WithDefaults().Validate()
	if len(errs) != 1 || errs[0].Key != "load_header_format" || !strings.Contains(errs[0].Msg, "auto, text, json or off") {
		t.Errorf("errors %+v; want one on load_header_format", errs)
	}
}

// The scraper reads the simulator's /metrics under each engine's names,
// and the simulator's vLLM header (asked for in either format) parses.
func TestSimulatorMetricNamesScrape(t *testing.T) {
	for _, tc := range []struct{ names, dialect string }{
		{gpusim.MetricsVLLM, DialectVLLM}, {gpusim.MetricsVLLMV0, DialectVLLM},
		{gpusim.MetricsSGLang, DialectSGLang}, {gpusim.MetricsTGI, DialectTGI},
	} {
		sim := gpusim.New(gpusim.Config{MetricNames: tc.names, LoadHeader: true, PrefillBase: -1, StepBase: 5e6, DefaultMaxTokens: 2})
		srv := httptest.NewServer(sim)
		p, _ := NewPool(quiet(srv.URL))
		b := p.Backends()[0]
		b.Config.Dialect = DialectAuto
		var buf bytes.Buffer
		if err := p.scrape(context.Background(), b, &buf); err != nil {
			t.Errorf("%s: %v", tc.names, err)
		} else if s := b.scraped.Load(); s.Dialect != tc.dialect || (tc.dialect != DialectTGI) != (s.KVCache >= 0) {
			t.Errorf("%s: sample %+v; want dialect %s", tc.names, s, tc.dialect)
		}
		for _, f := range []string{"TEXT", "json"} {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(`{"model":"sim-small","prompt":"hi"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Endpoint-Load-Metrics-Format", f)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			h := resp.Header.Get("Endpoint-Load-Metrics")
			_, ok := parseLoadHeader(h)
			if wantHdr := tc.dialect == DialectVLLM; ok != wantHdr {
				t.Errorf("%s, format %s: header %q (parsed %v); want one: %v", tc.names, f, h, ok, wantHdr)
			}
		}
		srv.Close()
		sim.Close()
	}
}
