package proxy_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sluice-proxy/sluice/internal/loadgen"
	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/proxy/observe"
)

// timings parses a Server-Timing value strictly: every entry must parse
// and carry a dur, except the counts tokens and tps, which must carry a
// numeric desc and no dur (devtools shows a dur as milliseconds).
func timings(t *testing.T, v string) map[string]time.Duration {
	t.Helper()
	if v == "" {
		t.Fatal("no Server-Timing")
	}
	ms := loadgen.ParseServerTiming(nil, v)
	if len(ms) != strings.Count(v, ",")+1 {
		t.Fatalf("Server-Timing %q: %d of %d entries parse", v, len(ms), strings.Count(v, ",")+1)
	}
	out := map[string]time.Duration{}
	for _, m := range ms {
		if m.Name == "tokens" || m.Name == "tps" {
			n, ok := m.Value()
			if m.HasDur || !ok || n < 0 {
				t.Fatalf("Server-Timing %q: count %s must be a desc number, not a dur", v, m.Name)
			}
			out[m.Name] = time.Duration(n * float64(time.Millisecond))
			continue
		}
		if !m.HasDur || m.Dur < 0 {
			t.Fatalf("Server-Timing %q: entry %s has no valid dur", v, m.Name)
		}
		out[m.Name] = time.Duration(m.Dur * float64(time.Millisecond))
	}
	return out
}

func TestServerTimingHeaderAndTrailer(t *testing.T) {
	slow := fastSim()
	slow.PrefillBase = 300 * time.Millisecond
	_, simURL := startSim(t, slow)
	e := startEdge(t, edgeOpts{pool: poolOf(simURL), limiter: limiter.NewLocal(1), limits: limiter.Limits{RequestsPerMinute: 1000}})
	// The trailer goes only to clients that sent "TE: trailers", on every
	// protocol: browsers (which cannot send it) get none.
	cases := []struct {
		name, base string
		client     *http.Client
		te         bool
		trailer    bool
	}{
		{"h2 with TE", e.https, h2Client(), true, true},
		{"h2 without TE", e.https, h2Client(), false, false},
		{"h2c with TE", e.http, h2cClient(), true, true},
		{"h2c without TE", e.http, h2cClient(), false, false},
		{"h1 with TE", e.http, h1Client(), true, true},
		{"h1 without TE", e.http, h1Client(), false, false},
		{"h3 with TE", e.h3, h3Client(t), true, true},
		{"h3 without TE", e.h3, h3Client(t), false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hdr := []string{}
			if tc.te {
				hdr = []string{"TE", "trailers"}
			}
			start := time.Now()
			resp := post(t, tc.client, tc.base+"/v1/chat/completions", chatBody(""), hdr...)
			// Announced in the header ("Trailer: Server-Timing"), which the
			// clients turn into a declared, still empty resp.Trailer key.
			if _, announced := resp.Trailer["Server-Timing"]; announced != tc.trailer {
				t.Errorf("trailer announced %v; want %v", announced, tc.trailer)
			}
			events, done := readEvents(t, resp.Body)
			resp.Body.Close()
			if !done || len(events) == 0 {
				t.Fatal("stream incomplete")
			}
			clientTTFT := events[0].at.Sub(start)
			st := timings(t, resp.Header.Get("Server-Timing"))
			for _, name := range []string{"auth", "recv", "route", "limit", "queue", "upstream", "prefill", "ttft", "edge"} {
				if _, ok := st[name]; !ok {
					t.Errorf("Server-Timing %q lacks %s", resp.Header.Get("Server-Timing"), name)
				}
			}
			if sum := st["queue"] + st["upstream"] + st["prefill"]; sum > st["ttft"]+time.Millisecond {
				t.Errorf("queue+upstream+prefill %v > ttft %v", sum, st["ttft"])
			}
			if st["ttft"] > clientTTFT {
				t.Errorf("edge ttft %v > client-observed ttft %v", st["ttft"], clientTTFT)
			}
			if st["prefill"] < 250*time.Millisecond {
				t.Errorf("prefill %v; the simulator's prefill takes ≥300ms", st["prefill"])
			}
			tr := resp.Trailer.Get("Server-Timing")
			if !tc.trailer {
				if tr != "" {
					t.Errorf("trailer %q sent to a client that did not ask", tr)
				}
				return
			}
			final := timings(t, tr)
			for _, name := range []string{"hold", "decode", "itl-p50", "itl-p99", "itl-max", "tokens", "tps"} {
				if _, ok := final[name]; !ok {
					t.Errorf("trailer %q lacks %s", tr, name)
				}
			}
			// hold (the first token read → its first write returned) ends
			// before the client has the token: ttft + hold fits in the
			// client's TTFT (both rounded to the microsecond).
			if st["ttft"]+final["hold"] > clientTTFT+10*time.Microsecond {
				t.Errorf("ttft %v + hold %v > client-observed ttft %v", st["ttft"], final["hold"], clientTTFT)
			}
			// "tokens" carries a count in desc: the simulator sends 12.
			if got := final["tokens"]; got != 12*time.Millisecond || !strings.Contains(tr, `tokens;desc="12"`) {
				t.Errorf("trailer %q: tokens = %v; want desc \"12\"", tr, float64(got)/1e6)
			}
			if final["itl-p50"] > final["itl-p99"] || final["itl-p99"] > final["itl-max"] || final["itl-p50"] <= 0 {
				t.Errorf("ITL percentiles out of order: %q", tr)
			}
		})
	}
}

func TestTimingCommentOnlyWhenAsked(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	for _, ask := range []bool{false, true} {
		hdr := []string{}
		if ask {
			hdr = []string{"X-Sluice-Timing", "comment"}
		}
		resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""), hdr...)
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body := string(raw)
		i := strings.Index(body, ": server-timing ")
		if (i >= 0) != ask {
			t.Fatalf("asked=%v but comment present=%v", ask, i >= 0)
		}
		if ask {
			line := body[i+len(": server-timing "):]
			line = line[:strings.IndexByte(line, '\n')]
			timings(t, line)
			if !strings.HasSuffix(body, "data: [DONE]\n\n") || i > strings.Index(body, "data: [DONE]") {
				t.Fatal("the comment must come before [DONE], which ends the stream")
			}
		}
	}
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Split(strings.TrimSpace(s.b.String()), "\n")
}

func TestAccessLogAndMetrics(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	var logs syncBuffer
	reg := prometheus.NewRegistry()
	e := startEdge(t, edgeOpts{pool: poolOf(simURL), log: &logs,
		metrics: observe.NewMetrics(reg, 10), limiter: limiter.NewLocal(1), limits: limiter.Limits{TokensPerMinute: 100000}})
	resp := post(t, h2cClient(), e.http+"/v1/chat/completions", chatBody(""), "Server-Timing", "spoofed;dur=1")
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if strings.Contains(resp.Header.Get("Server-Timing"), "spoofed") {
		t.Fatal("a client's Server-Timing came back")
	}
	waitFor(t, 2*time.Second, "the access log line", func() bool { return strings.Contains(strings.Join(logs.lines(), ""), `"msg":"request"`) })
	var line map[string]any
	if err := json.Unmarshal([]byte(logs.lines()[0]), &line); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"request_id", "tenant", "route", "backend", "proto", "status", "model", "auth_ms", "recv_ms",
		"route_ms", "limit_ms", "queue_ms", "upstream_ms", "prefill_ms", "ttft_ms", "edge_ms", "decode_ms", "e2e_ms",
		"itl_p50_ms", "itl_p99_ms", "tokens_in", "tokens_out", "bytes_in", "bytes_out", "error"} {
		if _, ok := line[k]; !ok {
			t.Errorf("access log line lacks %q: %v", k, line)
		}
	}
	if line["proto"] != "h2" || line["tenant"] != "t1" || line["tokens_out"].(float64) != 12 {
		t.Errorf("access log: proto %v tenant %v tokens_out %v", line["proto"], line["tenant"], line["tokens_out"])
	}
	if strings.Contains(strings.Join(logs.lines(), ""), testKey) || strings.Contains(strings.Join(logs.lines(), ""), "hello there") {
		t.Fatal("the access log holds the key or the prompt")
	}
	var text bytes.Buffer
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		expfmt.MetricFamilyToText(&text, mf)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	parsed, err := parser.TextToMetricFamilies(&text)
	if err != nil {
		t.Fatalf("metrics exposition does not parse: %v", err)
	}
	for _, name := range []string{"sluice_ttft_seconds", "sluice_itl_seconds", "sluice_stage_seconds", "sluice_tokens_total", "sluice_requests_total"} {
		if parsed[name] == nil {
			t.Errorf("metric %s missing", name)
		}
	}
	if got := parsed["sluice_itl_seconds"].GetMetric()[0].GetHistogram().GetSampleCount(); got != 11 {
		t.Errorf("ITL samples %d; want 11 (12 tokens)", got)
	}
	// The same request in the OpenTelemetry GenAI metrics, labelled with the
	// operation, the requested model and the backend that served it.
	simHost := strings.TrimPrefix(simURL, "http://")
	for _, name := range []string{"gen_ai_server_time_to_first_token_seconds", "gen_ai_server_time_per_output_token_seconds",
		"gen_ai_server_request_duration_seconds"} {
		mf := parsed[name]
		if mf == nil || len(mf.GetMetric()) != 1 || mf.GetMetric()[0].GetHistogram().GetSampleCount() != 1 {
			t.Errorf("%s: %v; want one series with one sample", name, mf)
			continue
		}
		labels := map[string]string{}
		for _, l := range mf.GetMetric()[0].GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["gen_ai_operation_name"] != "chat" || labels["gen_ai_request_model"] != "sim-small" ||
			labels["server_address"]+":"+labels["server_port"] != simHost {
			t.Errorf("%s labels %v; want chat, sim-small, %s", name, labels, simHost)
		}
	}
	var out float64
	for _, m := range parsed["gen_ai_client_token_usage"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "gen_ai_token_type" && l.GetValue() == "output" {
				out = m.GetHistogram().GetSampleSum()
			}
		}
	}
	if out != 12 {
		t.Errorf("gen_ai_client_token_usage output %v; want 12", out)
	}
}

func TestDebugStats(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(simURL), limiter: limiter.NewLocal(1), limits: limiter.Limits{RequestsPerMinute: 10}})
	for i := 0; i < 5; i++ {
		resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	snap := e.handler.Snapshot()
	if len(snap.Routes) != 1 {
		t.Fatalf("routes %+v", snap.Routes)
	}
	w := snap.Routes[0].Windows["1m"]
	ttft := w.Stages["ttft"]
	if w.Requests != 5 || ttft.N != 5 || ttft.P50 <= 0 || ttft.P50 > ttft.P95 || ttft.P95 > ttft.P99 {
		t.Fatalf("1m window: %+v", w)
	}
	if itl := w.Stages["itl"]; itl.N != 5*11 {
		t.Fatalf("ITL samples %d; want 55", itl.N)
	}
	if len(snap.Backends) != 1 || !snap.Backends[0].Healthy || snap.Backends[0].Running != nil {
		t.Fatalf("backends %+v; want one healthy backend, engine gauges unknown (no scrape ran)", snap.Backends)
	}
	if len(snap.Queues) != 2 || snap.Queues[0].Depth != 0 {
		t.Fatalf("queues %+v; want both classes of the pool, empty", snap.Queues)
	}
	if len(snap.Tenants) != 1 || snap.Tenants[0].Limit != "requests" || snap.Tenants[0].Remaining != 0.5 {
		t.Fatalf("tenants %+v; want t1 at half its requests", snap.Tenants)
	}
	admin := httptestAdmin(t, e)
	for _, path := range []string{"/debug/stats", "/"} {
		resp, err := http.Get(admin + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), "ttft") {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
	}
}

// TestServerTimingWholeBody: a non-streamed answer read whole (relayBody
// sets its exact Content-Length and the Server-Timing value from one
// buffer) carries a Server-Timing value that parses strictly, its first
// entry without a separator (it once began ", net-rtt": the Content-Length
// digits counted as a previous entry), through net/http's client and
// Sluice's own (h1up) transport alike.
func TestServerTimingWholeBody(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	body := `{"model":"sim-small","max_tokens":3,"messages":[{"role":"user","content":"hello there"}]}`
	for _, h1up := range []bool{false, true} {
		e := startEdge(t, edgeOpts{pool: poolOf(simURL), limiter: limiter.NewLocal(1), limits: limiter.Limits{RequestsPerMinute: 1000}, h1up: h1up})
		resp := post(t, h1Client(), e.http+"/v1/chat/completions", body)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.ContentLength != int64(len(b)) {
			t.Fatalf("h1up %v: status %d, Content-Length %d for %d bytes", h1up, resp.StatusCode, resp.ContentLength, len(b))
		}
		v := resp.Header.Get("Server-Timing")
		if strings.HasPrefix(v, ",") || strings.HasPrefix(v, " ") {
			t.Errorf("h1up %v: Server-Timing %q starts with a separator", h1up, v)
		}
		st := timings(t, v)
		for _, name := range []string{"auth", "recv", "route", "limit", "queue", "upstream", "ttft", "edge"} {
			if _, ok := st[name]; !ok {
				t.Errorf("h1up %v: Server-Timing %q lacks %s", h1up, v, name)
			}
		}
	}
}
