package routing

import (
	"bytes"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sluice-proxy/sluice/internal/gpusim"
)

func TestScanExpositionLines(t *testing.T) {
	cases := []struct {
		name, in string
		want     []string // "name=value" per sample
		err      error
	}{
		{"plain", "foo 1\n", []string{"foo=1"}, nil},
		{"labels", `vllm:num_requests_waiting{model_name="m",engine="0"} 3` + "\n", []string{"vllm:num_requests_waiting=3"}, nil},
		{"escaped label value", `a{l="x\"}\\ y\n"} 2`, []string{"a=2"}, nil},
		{"space before brace, none after", `a {l="v"}7`, []string{"a=7"}, nil},
		{"trailing comma", `a{l="v",} 1`, []string{"a=1"}, nil},
		{"timestamp", "a 1.5 1700000000000\n", []string{"a=1.5"}, nil},
		{"special values", "a NaN\nb +Inf\nc -Inf\nd 1e-3\n", []string{"a=NaN", "b=+Inf", "c=-Inf", "d=0.001"}, nil},
		{"comments and blanks", "# HELP a some help\n# TYPE a gauge\n\n  # free text\na 4\r\n", []string{"a=4"}, nil},
		{"utf8 name", `{"my.metric",l="v"} 5`, []string{"my.metric=5"}, nil},
		{"openmetrics eof and exemplar", "a_total 1 # {trace_id=\"x\"} 1\n# EOF\ngarbage here\n", []string{"a_total=1"}, nil},
		{"tabs", "a\t{l=\"v\"}\t2\t100", []string{"a=2"}, nil},
		{"empty type", "# TYPE a\na 1", []string{"a=1"}, nil},
		{"no value", "a\n", nil, errBadValue},
		{"bad value", "a one\n", nil, errBadValue},
		{"hex value", "a 0x1p3\n", nil, errBadValue},
		{"unterminated labels", `a{l="v" 1`, nil, errBadLabels},
		{"label without value", `a{l} 1`, nil, errBadLabels},
		{"bad escape", `a{l="\t"} 1`, nil, errBadLabels},
		{"unquoted label value", `a{l=v} 1`, nil, errBadLabels},
		{"bad name", "9a 1\n", nil, errBadName},
		{"name glued to value", "a-1\n", nil, errBadName},
		{"trailing garbage", "a 1 2 3\n", nil, errTrailing},
		{"bad timestamp", "a 1 soon\n", nil, errTrailing},
		{"bad type", "# TYPE a sometimes\n", nil, errBadType},
		{"bad help name", "# HELP 1a x\n", nil, errBadName},
		{"only braces", "{} 1\n", nil, errBadName},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			err := scanExposition([]byte(tc.in), func(name []byte, v float64) {
				got = append(got, string(name)+"="+formatFloat(v))
			})
			if !errors.Is(err, tc.err) {
				t.Fatalf("error %v; want %v", err, tc.err)
			}
			if tc.err == nil && strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Fatalf("got %q; want %q", got, tc.want)
			}
		})
	}
}

func formatFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// simMetrics returns a real simulator's /metrics text with some load.
func simMetrics(t testing.TB, cfg gpusim.Config) []byte {
	t.Helper()
	sim := gpusim.New(cfg)
	srv := httptest.NewServer(sim)
	defer func() { srv.Close(); sim.Close() }()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseGaugesDialects(t *testing.T) {
	vllm := simMetrics(t, gpusim.Config{})
	sglang := "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{model_name=\"m\"} 4\n" +
		"sglang:num_running_reqs{model_name=\"m\"} 9\nsglang:token_usage{model_name=\"m\"} 0.25\n"
	sglangUnderscore := strings.ReplaceAll(sglang, "sglang:", "sglang_")
	tgi := "# TYPE tgi_queue_size gauge\ntgi_queue_size 2\n# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size 7\n"
	dp := "vllm:num_requests_waiting{engine=\"0\"} 1\nvllm:num_requests_waiting{engine=\"1\"} 2\n" +
		"vllm:num_requests_running{engine=\"0\"} 3\nvllm:num_requests_running{engine=\"1\"} 4\n" +
		"vllm:gpu_cache_usage_perc{engine=\"0\"} 0.5\nvllm:kv_cache_usage_perc{engine=\"1\"} 0.75\n"
	cases := []struct {
		name, text, dialect string
		wantDialect         string
		w, r, kv            float64
		err                 bool
	}{
		{"vllm sim auto", string(vllm), DialectAuto, DialectVLLM, 0, 0, 0, false},
		{"vllm sim named", string(vllm), DialectVLLM, DialectVLLM, 0, 0, 0, false},
		{"vllm sim as tgi", string(vllm), DialectTGI, "", 0, 0, 0, true},
		{"sglang auto", sglang, DialectAuto, DialectSGLang, 4, 9, 0.25, false},
		{"sglang underscore", sglangUnderscore, DialectSGLang, DialectSGLang, 4, 9, 0.25, false},
		{"tgi auto", tgi, DialectAuto, DialectTGI, 2, 7, -1, false},
		{"data parallel sums, kv max", dp, DialectAuto, DialectVLLM, 3, 7, 0.75, false},
		{"waiting only", "vllm:num_requests_waiting 1\n", DialectAuto, "", 0, 0, 0, true},
		{"negative count", "tgi_queue_size -1\ntgi_batch_current_size 1\n", DialectAuto, "", 0, 0, 0, true},
		{"syntax error", "tgi_queue_size 1\ntgi_batch_current_size one\n", DialectAuto, "", 0, 0, 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := parseGauges([]byte(tc.text), tc.dialect)
			if tc.err {
				if err == nil {
					t.Fatalf("got %+v; want an error", s)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Dialect != tc.wantDialect || s.Waiting != tc.w || s.Running != tc.r || s.KVCache != tc.kv {
				t.Fatalf("got %s w=%v r=%v kv=%v; want %s w=%v r=%v kv=%v",
					s.Dialect, s.Waiting, s.Running, s.KVCache, tc.wantDialect, tc.w, tc.r, tc.kv)
			}
		})
	}
}

// The parser allocates nothing per scan, even on a full vLLM exposition.
func TestScanExpositionAllocs(t *testing.T) {
	data := simMetrics(t, gpusim.Config{})
	n := 0
	allocs := testing.AllocsPerRun(20, func() {
		if err := scanExposition(data, func([]byte, float64) { n++ }); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 || n == 0 {
		t.Fatalf("%v allocations per scan over %d samples; want 0", allocs, n)
	}
}

func BenchmarkParseGauges(b *testing.B) {
	data := simMetrics(b, gpusim.Config{})
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseGauges(data, DialectAuto); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzScanExposition checks that the parser never panics, and that where
// both it and prometheus/common's expfmt accept an input, they agree on the
// value of every gauge, counter and untyped series.
func FuzzScanExposition(f *testing.F) {
	f.Add(simMetrics(f, gpusim.Config{}))
	for _, s := range []string{
		"a 1\n", `a{l="v"} 2 3`, "# TYPE a gauge\na NaN\n", `{"x.y"} 1`, "a{l=\"\\\"\"} +Inf\n",
		"# HELP a h\\n\n# TYPE a counter\na 1\na{b=\"c\"} 2\n", "tgi_queue_size 2\ntgi_batch_current_size 7\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		sums := map[string]float64{}
		err := scanExposition(data, func(name []byte, v float64) { sums[string(name)] += v })
		parseGauges(data, DialectAuto) // must not panic either
		if err != nil {
			return
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, perr := p.TextToMetricFamilies(bytes.NewReader(data))
		if perr != nil {
			return
		}
		for name, fam := range fams {
			var sum float64
			n := 0
			for _, m := range fam.GetMetric() {
				switch {
				case m.Gauge != nil:
					sum += m.Gauge.GetValue()
				case m.Counter != nil:
					sum += m.Counter.GetValue()
				case m.Untyped != nil:
					sum += m.Untyped.GetValue()
				default:
					continue
				}
				n++
			}
			if n == 0 || strings.ContainsAny(name, "\"\\\n") {
				continue
			}
			got, ok := sums[name]
			if !ok || !(got == sum || math.IsNaN(got) && math.IsNaN(sum)) {
				t.Fatalf("series %q: scanExposition sums %v (present %v); expfmt %v\ninput %q", name, got, ok, sum, data)
			}
		}
	})
}
