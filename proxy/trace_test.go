package proxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/sluice-proxy/sluice/internal/gpusim"
	"github.com/sluice-proxy/sluice/internal/otlptest"
	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/proxy/tracing"
	"github.com/sluice-proxy/sluice/routing"
)

// tracedSim is a real simulator behind a recorder of the trace headers
// each request brings: what a vLLM or SGLang server (both read the W3C
// traceparent through their OpenTelemetry instrumentation) would continue.
type tracedSim struct {
	url string
	sim *gpusim.Sim
	mu  sync.Mutex
	got []http.Header // traceparent and tracestate of each request
}

func startTracedSim(t *testing.T, cfg gpusim.Config) *tracedSim {
	t.Helper()
	ts := &tracedSim{sim: gpusim.New(cfg)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ts.mu.Lock()
		ts.got = append(ts.got, http.Header{"Traceparent": r.Header.Values("Traceparent"), "Tracestate": r.Header.Values("Tracestate")})
		ts.mu.Unlock()
		ts.sim.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { srv.Close(); ts.sim.Close() })
	ts.url = srv.URL
	return ts
}

func (ts *tracedSim) headers() []http.Header {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return slices.Clone(ts.got)
}

// testTracer exports to rcv with a parent-based ratio sampler.
func testTracer(t testing.TB, rcv *otlptest.Receiver, ratio float64, stageSpans bool) *tracing.Tracer {
	t.Helper()
	tr, err := tracing.New(context.Background(), tracing.Config{Enabled: true, Endpoint: rcv.URL, SamplerRatio: &ratio, StageSpans: stageSpans}, "test")
	if err != nil || tr == nil {
		t.Fatalf("tracing.New: %v, %v", tr, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tr.Shutdown(ctx)
	})
	return tr
}

// spanTree is one received trace, around its SERVER span.
type spanTree struct {
	server otlptest.Span
	spans  []otlptest.Span
}

// waitTrace flushes the tracer until the trace's server span and at least
// n spans in all have arrived.
func waitTrace(t *testing.T, tr *tracing.Tracer, rcv *otlptest.Receiver, traceID string, n int) spanTree {
	t.Helper()
	var st spanTree
	waitFor(t, 5*time.Second, "the trace's spans at the receiver", func() bool {
		tr.ForceFlush(context.Background())
		st = spanTree{spans: rcv.Trace(traceID)}
		found := false
		for _, s := range st.spans {
			if s.Kind == tracepb.Span_SPAN_KIND_SERVER {
				st.server, found = s, true
			}
		}
		return found && len(st.spans) >= n
	})
	if bad := rcv.Bad(); bad != nil {
		t.Fatalf("malformed exports: %v", bad)
	}
	return st
}

// child returns the server span's children named name, in start order.
func (st spanTree) children(name string) []otlptest.Span {
	var out []otlptest.Span
	for _, s := range st.spans {
		if s.ParentID == st.server.SpanID && s.Name == name {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b otlptest.Span) int { return a.Start.Compare(b.Start) })
	return out
}

func (st spanTree) one(t *testing.T, name string) otlptest.Span {
	t.Helper()
	c := st.children(name)
	if len(c) != 1 {
		t.Fatalf("%d %q spans under the server span; want 1 (spans: %v)", len(c), name, st.names())
	}
	return c[0]
}

func (st spanTree) names() []string {
	var out []string
	for _, s := range st.spans {
		out = append(out, s.Name)
	}
	return out
}

func hasEvent(s otlptest.Span, name string) bool { _, ok := s.Event(name); return ok }

// traceparent is a client's sampled traceparent for a trace id.
func traceparent(traceID, parent string) string { return "00-" + traceID + "-" + parent + "-01" }

// parentOf splits a traceparent into trace id and parent id.
func parentOf(tp string) (traceID, parent string) {
	p := strings.Split(tp, "-")
	if len(p) != 4 {
		return "", ""
	}
	return p[1], p[2]
}

// A streamed request over HTTP/1.1, HTTP/2 and HTTP/3 continues the
// client's trace: one SERVER span whose parent is the client's span, a
// child per stage, a CLIENT span for the upstream attempt whose id the
// backend receives as its parent, the GenAI attributes, and the trace id
// and client address in the access log line.
func TestTraceStreamContinuesClientTrace(t *testing.T) {
	rcv := otlptest.Start(t)
	tr := testTracer(t, rcv, 1, true)
	ts := startTracedSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(ts.url), tracer: tr})
	clients := []struct {
		name string
		c    *http.Client
		url  string
	}{{"h1", h1Client(), e.http}, {"h2", h2Client(), e.https}, {"h3", h3Client(t), e.h3}}
	for i, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			traceID := fmt.Sprintf("4bf92f3577b34da6a3ce929d0e0e47%02x", i)
			const clientSpan = "00f067aa0ba902b7"
			resp := post(t, c.c, c.url+"/v1/chat/completions", chatBody(""),
				"Traceparent", traceparent(traceID, clientSpan), "Tracestate", "vendor=abc")
			_, done := readEvents(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !done {
				t.Fatalf("status %d, done=%v", resp.StatusCode, done)
			}
			st := waitTrace(t, tr, rcv, traceID, 9)
			s := st.server
			if s.ParentID != clientSpan || s.TraceState != "vendor=abc" {
				t.Errorf("server span parent %q tracestate %q; want the client's %q, vendor=abc", s.ParentID, s.TraceState, clientSpan)
			}
			want := map[string]any{
				"gen_ai.operation.name": "chat", "gen_ai.request.model": "sim-small", "gen_ai.request.max_tokens": int64(12),
				"sluice.tenant.id": "t1", "sluice.request.id": resp.Header.Get("X-Request-Id"),
				"http.response.status_code": int64(200), "http.request.method": "POST", "client.address": "127.0.0.1",
				"network.protocol.name": c.name, "sluice.route": "/v1/", // the default route's name is its path
			}
			for k, v := range want {
				if s.Attrs[k] != v {
					t.Errorf("server span %s = %#v; want %#v", k, s.Attrs[k], v)
				}
			}
			in, _ := s.Attrs["gen_ai.usage.input_tokens"].(int64)
			out, _ := s.Attrs["gen_ai.usage.output_tokens"].(int64)
			if in <= 0 || out != 12 { // max_tokens 12, finish_reason length
				t.Errorf("gen_ai.usage input %d output %d; want > 0 and 12", in, out)
			}
			if fr, _ := s.Attrs["gen_ai.response.finish_reasons"].([]string); !slices.Equal(fr, []string{"length"}) {
				t.Errorf("gen_ai.response.finish_reasons = %v; want [length]", fr)
			}
			if timing, _ := s.Attrs["sluice.server_timing"].(string); timing != resp.Header.Get("Server-Timing") {
				t.Errorf("sluice.server_timing %q; want the Server-Timing header %q", timing, resp.Header.Get("Server-Timing"))
			}
			if s.Resource["service.name"] != "sluice" {
				t.Errorf("resource service.name %v", s.Resource["service.name"])
			}
			for _, name := range []string{"auth", "recv", "route", "limit", "queue", "prefill", "decode"} {
				c := st.one(t, name)
				if c.Start.Before(s.Start) || c.End.After(s.End) || c.End.Before(c.Start) {
					t.Errorf("%s span [%v, %v] outside the server span [%v, %v]", name, c.Start, c.End, s.Start, s.End)
				}
			}
			if d := st.one(t, "decode"); d.Attrs["gen_ai.usage.output_tokens"] != int64(12) {
				t.Errorf("decode span output tokens %v; want 12", d.Attrs["gen_ai.usage.output_tokens"])
			}
			if p, d := st.one(t, "prefill"), st.one(t, "decode"); !p.End.Equal(d.Start) {
				t.Errorf("prefill ends %v, decode starts %v; want the first token between them", p.End, d.Start)
			}
			up := st.one(t, "upstream")
			if up.Kind != tracepb.Span_SPAN_KIND_CLIENT || up.Attrs["sluice.attempt.result"] != "relayed" ||
				up.Attrs["http.response.status_code"] != int64(200) || !hasEvent(up, "first_token") {
				t.Errorf("upstream span %+v; want a CLIENT span, relayed, 200, with a first_token event", up)
			}
			got := ts.headers()
			tp := got[len(got)-1].Get("Traceparent")
			if tid, parent := parentOf(tp); tid != traceID || parent != up.SpanID {
				t.Errorf("backend got traceparent %q; want trace %s under the upstream span %s", tp, traceID, up.SpanID)
			}
			if got[len(got)-1].Get("Tracestate") != "vendor=abc" {
				t.Errorf("backend got tracestate %q; want the client's", got[len(got)-1].Get("Tracestate"))
			}
			lines := e.log.lines(`"msg":"request"`, resp.Header.Get("X-Request-Id"))
			if len(lines) != 1 || !strings.Contains(lines[0], `"trace_id":"`+traceID+`"`) || !strings.Contains(lines[0], `"client":"127.0.0.1"`) {
				t.Errorf("access log %q; want one line with the trace id and the client address", lines)
			}
		})
	}
}

// A request whose first attempt fails is one trace with a failed CLIENT
// span and the retried one; each backend continued the trace under its own
// attempt's span.
func TestTraceRetriedAttemptSpans(t *testing.T) {
	rcv := otlptest.Start(t)
	tr := testTracer(t, rcv, 1, false)
	bad := fastSim()
	bad.FailBeforeFirst = 1
	badSim := startTracedSim(t, bad)
	goodSim := startTracedSim(t, fastSim())
	pool := poolOf(badSim.url, goodSim.url)
	pool.Policy = routing.PolicyRoundRobin // the first attempt goes to the failing backend
	pool.EjectAfter = 1000
	errLog := &logBuffer{}
	e := startEdge(t, edgeOpts{pool: pool, tracer: tr, errLog: errLog})
	const traceID = "0af7651916cd43dd8448eb211c80319c"
	resp := post(t, h2cClient(), e.http+"/v1/chat/completions", chatBody(""), "Traceparent", traceparent(traceID, "b7ad6b7169203331"))
	_, done := readEvents(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !done {
		t.Fatalf("status %d, done=%v", resp.StatusCode, done)
	}
	st := waitTrace(t, tr, rcv, traceID, 3)
	ups := st.children("upstream")
	if len(ups) != 2 {
		t.Fatalf("%d upstream spans; want 2 (spans %v)", len(ups), st.names())
	}
	first, second := ups[0], ups[1]
	if first.StatusCode != tracepb.Status_STATUS_CODE_ERROR || first.Attrs["sluice.attempt.result"] != "failed" ||
		first.Attrs["http.response.status_code"] != int64(500) || first.Attrs["sluice.attempt"] != int64(0) || first.StatusMsg == "" {
		t.Errorf("first attempt %+v; want an error span: failed, 500, attempt 0, with the cause", first)
	}
	if second.StatusCode == tracepb.Status_STATUS_CODE_ERROR || second.Attrs["sluice.attempt.result"] != "relayed" || second.Attrs["sluice.attempt"] != int64(1) {
		t.Errorf("second attempt %+v; want relayed, attempt 1", second)
	}
	// The failed attempt's warn line names the trace too.
	if lines := errLog.lines("upstream attempt failed", "trace_id="+traceID); len(lines) != 1 {
		t.Errorf("warn lines %q; want one for the failed attempt with the trace id", lines)
	}
	if st.server.Attrs["sluice.retries"] != int64(1) {
		t.Errorf("server span sluice.retries %v; want 1", st.server.Attrs["sluice.retries"])
	}
	for _, c := range []struct {
		sim  *tracedSim
		span otlptest.Span
	}{{badSim, first}, {goodSim, second}} {
		got := c.sim.headers()
		if len(got) != 1 {
			t.Fatalf("backend got %d requests; want 1", len(got))
		}
		if tid, parent := parentOf(got[0].Get("Traceparent")); tid != traceID || parent != c.span.SpanID {
			t.Errorf("backend traceparent %q; want trace %s under its attempt %s", got[0].Get("Traceparent"), traceID, c.span.SpanID)
		}
	}
}

// A hedged request is one trace with both legs as CLIENT spans: the
// hedge relayed, the slow leg ended as hedge_lost; each backend continued
// the trace under its leg's span.
func TestTraceHedgedLegSpans(t *testing.T) {
	rcv := otlptest.Start(t)
	tr := testTracer(t, rcv, 1, false)
	slow := fastSim()
	slow.PrefillBase = 5 * time.Second
	slowSim := startTracedSim(t, slow)
	fastS := startTracedSim(t, fastSim())
	pool := poolOf(slowSim.url, fastS.url)
	pool.Policy = routing.PolicyRoundRobin // the first leg goes to the slow backend
	e := startEdge(t, edgeOpts{pool: pool, tracer: tr, routes: []testRoute{{RouteConfig: routing.RouteConfig{Pool: "p"},
		RoutePolicy: proxy.RoutePolicy{HedgeAfter: 150 * time.Millisecond}}}})
	const traceID = "5b8efff798038103d269b633813fc60c"
	resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""), "Traceparent", traceparent(traceID, "eee19b7ec3c1b174"))
	_, done := readEvents(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !done {
		t.Fatalf("status %d, done=%v", resp.StatusCode, done)
	}
	st := waitTrace(t, tr, rcv, traceID, 3)
	ups := st.children("upstream")
	if len(ups) != 2 {
		t.Fatalf("%d upstream spans; want 2 (spans %v)", len(ups), st.names())
	}
	lost, won := ups[0], ups[1]
	if lost.Attrs["sluice.attempt.result"] != "hedge_lost" || lost.Attrs["sluice.hedge"] != nil {
		t.Errorf("first leg %+v; want the primary, hedge_lost", lost.Attrs)
	}
	if won.Attrs["sluice.attempt.result"] != "relayed" || won.Attrs["sluice.hedge"] != true {
		t.Errorf("second leg %+v; want the hedge, relayed", won.Attrs)
	}
	if won.Start.Sub(lost.Start) < 150*time.Millisecond {
		t.Errorf("hedge started %v after the first leg; want hedge_after (150ms)", won.Start.Sub(lost.Start))
	}
	if st.server.Attrs["sluice.hedged"] != true {
		t.Errorf("server span sluice.hedged %v", st.server.Attrs["sluice.hedged"])
	}
	for _, c := range []struct {
		sim  *tracedSim
		span otlptest.Span
	}{{slowSim, lost}, {fastS, won}} {
		got := c.sim.headers()
		if len(got) != 1 {
			t.Fatalf("backend got %d requests; want 1", len(got))
		}
		if tid, parent := parentOf(got[0].Get("Traceparent")); tid != traceID || parent != c.span.SpanID {
			t.Errorf("backend traceparent %q; want trace %s under its leg %s", got[0].Get("Traceparent"), traceID, c.span.SpanID)
		}
	}
}

// The sampler is parent-based: at ratio 0 a request without a
// traceparent exports nothing, but still has a trace id (in the access
// log, and sent unsampled to the backend); a client's sampled
// traceparent is followed and exported.
func TestTraceSamplerParentBased(t *testing.T) {
	rcv := otlptest.Start(t)
	tr := testTracer(t, rcv, 0, false)
	ts := startTracedSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(ts.url), tracer: tr})

	resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
	readEvents(t, resp.Body)
	resp.Body.Close()
	waitFor(t, 2*time.Second, "the access log line", func() bool { return len(e.log.lines(resp.Header.Get("X-Request-Id"))) == 1 })
	var line struct {
		TraceID string `json:"trace_id"`
	}
	json.Unmarshal([]byte(e.log.lines(resp.Header.Get("X-Request-Id"))[0]), &line)
	tp := ts.headers()[0].Get("Traceparent")
	if tid, _ := parentOf(tp); tid == "" || tid != line.TraceID || !strings.HasSuffix(tp, "-00") {
		t.Errorf("backend traceparent %q, logged trace id %q; want the same id, unsampled", tp, line.TraceID)
	}

	const traceID = "11111111111111111111111111111111"
	resp = post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""), "Traceparent", traceparent(traceID, "2222222222222222"))
	readEvents(t, resp.Body)
	resp.Body.Close()
	waitTrace(t, tr, rcv, traceID, 2)
	for _, s := range rcv.Spans() {
		if s.TraceID != traceID {
			t.Fatalf("span %q of trace %s exported; want only the client's sampled trace", s.Name, s.TraceID)
		}
	}
}

// With tracing off, the access log still names the client's trace (the
// backend receives its traceparent unchanged) and the client's address;
// a request without one has no trace_id.
func TestTraceOffLogsClientTraceID(t *testing.T) {
	ts := startTracedSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(ts.url)})
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	for _, h := range []string{tp, "", "00-00000000000000000000000000000000-b7ad6b7169203331-01", "garbage"} {
		resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""), "Traceparent", h)
		readEvents(t, resp.Body)
		resp.Body.Close()
		id := resp.Header.Get("X-Request-Id")
		waitFor(t, 2*time.Second, "the access log line", func() bool { return len(e.log.lines(id)) == 1 })
		l := e.log.lines(id)[0]
		if !strings.Contains(l, `"client":"127.0.0.1"`) {
			t.Errorf("access log %s; want the client address", l)
		}
		if h == tp {
			if !strings.Contains(l, `"trace_id":"0af7651916cd43dd8448eb211c80319c"`) {
				t.Errorf("access log %s; want the client's trace id", l)
			}
			got := ts.headers()
			if g := got[len(got)-1].Get("Traceparent"); g != tp {
				t.Errorf("backend traceparent %q; want the client's, unchanged", g)
			}
		} else if strings.Contains(l, "trace_id") {
			t.Errorf("access log %s for traceparent %q; want no trace_id", l, h)
		}
	}
}

// By default each stage is an event on the server span, at the stage's
// end, with its duration; the trace is then the server span and one
// CLIENT span per attempt.
func TestTraceStageEvents(t *testing.T) {
	rcv := otlptest.Start(t)
	tr := testTracer(t, rcv, 1, false)
	ts := startTracedSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(ts.url), tracer: tr})
	const traceID = "33333333333333333333333333333333"
	resp := post(t, h2cClient(), e.http+"/v1/chat/completions", chatBody(""), "Traceparent", traceparent(traceID, "4444444444444444"))
	_, done := readEvents(t, resp.Body)
	resp.Body.Close()
	if !done {
		t.Fatal("stream did not end with [DONE]")
	}
	st := waitTrace(t, tr, rcv, traceID, 2)
	if len(st.spans) != 2 || len(st.children("upstream")) != 1 {
		t.Fatalf("spans %v; want the server span and one upstream span", st.names())
	}
	s := st.server
	var last time.Time
	for _, name := range []string{"auth", "recv", "route", "limit", "queue", "prefill", "decode"} {
		ev, ok := s.Event(name)
		if !ok || ev.Time.Before(s.Start) || ev.Time.After(s.End) || ev.Time.Before(last) {
			t.Errorf("stage event %q %+v (found %v); want one in order inside the server span", name, ev, ok)
		}
		last = ev.Time
	}
	if ev, _ := s.Event("decode"); ev.Attrs["gen_ai.usage.output_tokens"] != int64(12) {
		t.Errorf("decode event %v; want 12 output tokens", ev.Attrs)
	}
	if p, d := s.Events[len(s.Events)-2], s.Events[len(s.Events)-1]; d.Time.Sub(p.Time) < 10*time.Millisecond {
		t.Errorf("decode ended %v after prefill; want >= 10 ms (12 tokens at 10 ms steps)", d.Time.Sub(p.Time))
	}
	// The durations are the Server-Timing header's.
	timing, _ := s.Attrs["sluice.server_timing"].(string)
	if hdr := resp.Header.Get("Server-Timing"); timing != hdr || !strings.Contains(timing, "prefill;dur=") {
		t.Errorf("sluice.server_timing %q; want the Server-Timing header %q", timing, hdr)
	}
}

// With stage_events: false the server span has no events (the cheapest
// trace); the stages' durations are still in sluice.server_timing, the
// attempt still has its CLIENT span and the backend its traceparent.
func TestTraceNoStageEvents(t *testing.T) {
	rcv := otlptest.Start(t)
	ratio, events := 1.0, false
	tr, err := tracing.New(context.Background(), tracing.Config{Enabled: true, Endpoint: rcv.URL, SamplerRatio: &ratio, StageEvents: &events}, "test")
	if err != nil || tr == nil {
		t.Fatalf("tracing.New: %v, %v", tr, err)
	}
	defer tr.Shutdown(context.Background())
	ts := startTracedSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(ts.url), tracer: tr})
	const traceID = "55555555555555555555555555555555"
	resp := post(t, h2cClient(), e.http+"/v1/chat/completions", chatBody(""), "Traceparent", traceparent(traceID, "6666666666666666"))
	_, done := readEvents(t, resp.Body)
	resp.Body.Close()
	if !done {
		t.Fatal("stream did not end with [DONE]")
	}
	st := waitTrace(t, tr, rcv, traceID, 2)
	up := st.one(t, "upstream")
	if len(st.server.Events) != 0 {
		t.Errorf("server span events %v; want none", st.server.Events)
	}
	timing, _ := st.server.Attrs["sluice.server_timing"].(string)
	if hdr := resp.Header.Get("Server-Timing"); timing != hdr || !strings.Contains(timing, "prefill;dur=") {
		t.Errorf("sluice.server_timing %q; want the Server-Timing header %q", timing, hdr)
	}
	if hs := ts.headers(); len(hs) != 1 || hs[0].Get("Traceparent") != traceparent(traceID, up.SpanID) {
		t.Errorf("backend traceparent %v; want the upstream span %s", hs, up.SpanID)
	}
}

// Traced requests share nothing that outlives them: each request's trace
// state goes back to a free list once the request and every attempt's span
// have ended (trace.go, reqTrace), while hedges' losing legs end on their
// own goroutines and a retried or hedged attempt's backend request holds
// its traceparent. Many concurrent requests, retried (one backend fails a
// third of its requests before the first token) and hedged (the hedge
// fires after 2 ms, so most requests race two legs and cancel the
// loser), streamed over HTTP/1.1 (the event loops complete those) and
// HTTP/2, and not streamed, each continuing its own client trace: every
// backend request's traceparent names an upstream span of its own
// request's trace, every trace has one server span with its upstream
// spans under it, and the access log and the failed attempts' warnings
// name only the requests' own trace ids. Run under -race this also checks
// the free list's hand-over between the exchange and the legs.
func TestTraceReuseUnderRetriesAndHedges(t *testing.T) {
	rcv := otlptest.Start(t)
	tr := testTracer(t, rcv, 1, false)
	flaky := fastSim()
	flaky.FailBeforeFirst = 0.3
	flaky.Seed = 7
	sims := []*tracedSim{startTracedSim(t, flaky), startTracedSim(t, fastSim()), startTracedSim(t, fastSim())}
	pool := poolOf(sims[0].url, sims[1].url, sims[2].url)
	pool.Policy = routing.PolicyRoundRobin
	pool.EjectAfter = 1000
	three := 3
	errLog := &logBuffer{}
	edges := []*testEdge{
		startEdge(t, edgeOpts{pool: pool, tracer: tr, errLog: errLog, routes: []testRoute{{RouteConfig: routing.RouteConfig{Pool: "p"},
			RoutePolicy: proxy.RoutePolicy{HedgeAfter: 2 * time.Millisecond, Retries: &three}}}}),
		startEdge(t, edgeOpts{pool: pool, tracer: tr, errLog: errLog, routes: []testRoute{{RouteConfig: routing.RouteConfig{Pool: "p"},
			RoutePolicy: proxy.RoutePolicy{Retries: &three}}}}),
	}
	const workers, perWorker = 6, 12
	type sent struct{ traceID, clientSpan, requestID string }
	var mu sync.Mutex
	var all []sent
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := h1Client()
			if w%2 == 1 {
				c = h2cClient()
			}
			for i := range perWorker {
				e := edges[(w/2+i)%2]
				traceID := fmt.Sprintf("7a0c%04x%04x00000000000000000000", w, i)
				clientSpan := fmt.Sprintf("c11e%04x%04x0001", w, i)
				body := chatBody("")
				if i%3 == 2 {
					body = strings.Replace(body, `"stream":true`, `"stream":false`, 1)
				}
				resp := post(t, c, e.http+"/v1/chat/completions", body, "Traceparent", traceparent(traceID, clientSpan))
				if strings.Contains(body, `"stream":true`) {
					if _, done := readEvents(t, resp.Body); !done {
						t.Errorf("request %s: the stream did not end with [DONE]", traceID)
					}
				} else {
					io.Copy(io.Discard, resp.Body)
				}
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Errorf("request %s: status %d", traceID, resp.StatusCode)
				}
				mu.Lock()
				all = append(all, sent{traceID, clientSpan, resp.Header.Get("X-Request-Id")})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	upstreams := map[string]string{} // upstream span id -> its trace id
	retried, hedged := 0, 0
	for _, s := range all {
		st := waitTrace(t, tr, rcv, s.traceID, 2)
		if st.server.ParentID != s.clientSpan {
			t.Errorf("trace %s: server span's parent %s; want the client's %s", s.traceID, st.server.ParentID, s.clientSpan)
		}
		if st.server.Attrs["sluice.request.id"] != s.requestID {
			t.Errorf("trace %s: server span's request id %v; want %s", s.traceID, st.server.Attrs["sluice.request.id"], s.requestID)
		}
		servers, ups := 0, st.children("upstream")
		for _, sp := range st.spans {
			if sp.Kind == tracepb.Span_SPAN_KIND_SERVER {
				servers++
			}
		}
		if servers != 1 || len(ups) == 0 || len(ups) != len(st.spans)-1 {
			t.Errorf("trace %s: %d server spans, %d upstream spans under it, %d spans in all; want 1 server span and the rest upstream under it",
				s.traceID, servers, len(ups), len(st.spans))
		}
		for _, u := range ups {
			upstreams[u.SpanID] = s.traceID
		}
		if st.server.Attrs["sluice.retries"] != nil {
			retried++
		}
		if st.server.Attrs["sluice.hedged"] == true {
			hedged++
		}
	}
	if n := len(rcv.Spans()); n != len(all)+len(upstreams) {
		t.Errorf("the receiver has %d spans; want %d: the requests' server and upstream spans only", n, len(all)+len(upstreams))
	}
	if retried == 0 || hedged == 0 {
		t.Errorf("%d requests retried, %d hedged; want some of each", retried, hedged)
	}
	backendRequests := 0
	for _, sim := range sims {
		for _, h := range sim.headers() {
			backendRequests++
			tid, parent := parentOf(h.Get("Traceparent"))
			if upstreams[parent] != tid || tid == "" {
				t.Errorf("a backend got traceparent %q: not an upstream span of its trace (that span's trace: %q)", h.Get("Traceparent"), upstreams[parent])
			}
		}
	}
	for _, e := range edges {
		for _, line := range e.log.lines(`"msg":"request"`) {
			var rec struct {
				ID      string `json:"request_id"`
				TraceID string `json:"trace_id"`
			}
			json.Unmarshal([]byte(line), &rec)
			found := false
			for _, s := range all {
				found = found || s.requestID == rec.ID && s.traceID == rec.TraceID
			}
			if !found {
				t.Errorf("access log line with request id %q and trace id %q: not a request sent with that trace", rec.ID, rec.TraceID)
			}
		}
	}
	warns := errLog.lines("upstream attempt failed")
	for _, line := range warns {
		i := strings.Index(line, "trace_id=")
		if i < 0 || !upstreamsHasTrace(upstreams, line[i+len("trace_id="):][:min(32, len(line)-i-len("trace_id="))]) {
			t.Errorf("warn line %q: not a request's trace id", line)
		}
	}
	t.Logf("%d requests, %d retried, %d hedged, %d backend requests, %d upstream spans, %d failed attempts logged",
		len(all), retried, hedged, backendRequests, len(upstreams), len(warns))
}

func upstreamsHasTrace(upstreams map[string]string, traceID string) bool {
	for _, tid := range upstreams {
		if tid == traceID {
			return true
		}
	}
	return false
}
