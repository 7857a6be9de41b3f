package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// requestOps makes, on tr, what the pipeline makes of requests (trace.go):
// a server span continuing a client's traceparent, its upstream CLIENT
// spans (one failed, one relayed), stages, the attributes set at the end
// (some twice, one invalid), a renamed span, an error status and a
// recorded error; then a request Sluice starts itself (a new trace) and
// one the client sent unsampled (nothing recorded). Every time is given,
// so that two tracers' exports can be compared.
func requestOps(t *testing.T, tr *Tracer) {
	t.Helper()
	t0 := time.Unix(1764770000, 123456789)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	in := http.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, "Tracestate": {"vendor=abc"}}
	ctx, s := tr.StartServer(in, "POST", t0)
	if !s.IsRecording() {
		t.Fatal("a sampled client's request is not recorded")
	}
	for i, result := range []string{"failed", "relayed"} {
		c := tr.Start(ctx, "upstream", trace.SpanKindClient, at(1+10*i), attribute.String("server.address", "127.0.0.1"),
			attribute.Int("sluice.attempt", i), attribute.Int("server.port", 8000), attribute.String("sluice.pool", "p"))
		out := http.Header{}
		tr.Inject(c, out)
		if want := "00-4bf92f3577b34da6a3ce929d0e0e4736-" + c.SpanContext().SpanID().String() + "-01"; out.Get("Traceparent") != want || out.Get("Tracestate") != "vendor=abc" {
			t.Errorf("injected %v; want %s and the client's tracestate", out, want)
		}
		c.AddEvent("first_token", trace.WithTimestamp(at(5+10*i)))
		c.SetAttributes(attribute.Int("http.response.status_code", 200), attribute.String("sluice.attempt.result", result))
		if result == "failed" {
			c.SetStatus(codes.Error, "upstream: 500")
			c.SetStatus(codes.Unset, "ignored: below the error")
			c.RecordError(errors.New("boom"), trace.WithTimestamp(at(6)))
		}
		c.End(trace.WithTimestamp(at(9 + 10*i)))
		c.SetAttributes(attribute.Bool("after.end", true)) // ignored
	}
	var marks []Mark
	for i, st := range []string{"auth", "recv", "route", "limit", "queue", "prefill", "decode"} {
		marks = append(marks, Mark{Name: st, Start: at(i), End: at(i + 1)})
	}
	marks[6].Attrs = []attribute.KeyValue{attribute.Int64("gen_ai.usage.output_tokens", 12)}
	tr.Stages(ctx, marks)
	s.SetAttributes(attribute.String("http.request.method", "POST"), attribute.Int("http.response.status_code", 200),
		attribute.String("", "invalid"), attribute.StringSlice("gen_ai.response.finish_reasons", []string{"stop"}),
		attribute.Float64("f", 0.5), attribute.Bool("b", false), attribute.Int64Slice("is", []int64{1, 2}))
	s.SetAttributes(attribute.Int("http.response.status_code", 502), attribute.String("sluice.route", "main"))
	s.SetName("POST main")
	s.SetStatus(codes.Error, "bad gateway")
	s.AddLink(trace.Link{SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: 1}),
		Attributes: []attribute.KeyValue{attribute.String("k", "v")}})
	s.End(trace.WithTimestamp(at(30)))

	ctx, s = tr.StartServer(http.Header{}, "GET", at(40)) // a trace Sluice starts
	if !s.SpanContext().TraceID().IsValid() || !s.SpanContext().IsSampled() {
		t.Errorf("root span %v; want a new sampled trace", s.SpanContext())
	}
	tr.Span(ctx, "child", at(41), at(42), attribute.String("x", "y"))
	s.End(trace.WithTimestamp(at(43)))

	ctx, s = tr.StartServer(http.Header{"Traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}}, "POST", at(50))
	c := tr.Start(ctx, "upstream", trace.SpanKindClient, at(51))
	if s.IsRecording() || c.IsRecording() || c.SpanContext().IsSampled() || !c.SpanContext().IsValid() {
		t.Errorf("unsampled client: recording %v %v, context %v; want an unsampled span context only", s.IsRecording(), c.IsRecording(), c.SpanContext())
	}
	c.End()
	s.End()
}

// normalized decodes an export and renumbers its trace and span ids in
// the order they appear, the ids being random.
func normalized(t *testing.T, c *capture) *coltrace.ExportTraceServiceRequest {
	t.Helper()
	m, _ := c.last(t)
	ids := map[string][]byte{}
	renum := func(b []byte) []byte {
		if len(b) == 0 {
			return b
		}
		n, ok := ids[string(b)]
		if !ok {
			n = make([]byte, len(b))
			n[len(n)-1] = byte(len(ids) + 1)
			ids[string(b)] = n
		}
		return n
	}
	for _, rs := range m.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				s.TraceId, s.SpanId, s.ParentSpanId = renum(s.TraceId), renum(s.SpanId), renum(s.ParentSpanId)
			}
		}
	}
	return m
}

// TestLeanMatchesSDK: the lean recorder exports, byte for byte after
// renumbering the random ids, the spans the OpenTelemetry SDK exports for
// the same operations (the SDK used through the same Tracer, as New does
// when an OTEL_*_LIMIT variable is set), with stage events and with stage
// spans.
func TestLeanMatchesSDK(t *testing.T) {
	one := 1.0
	for _, stageSpans := range []bool{false, true} {
		t.Run(fmt.Sprint("stage_spans=", stageSpans), func(t *testing.T) {
			sdkEnd, leanEnd := startCapture(t), startCapture(t)
			t.Setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "128") // the SDK's default: only makes New use the SDK
			sdk, err := New(context.Background(), Config{Enabled: true, Endpoint: sdkEnd.URL, SamplerRatio: &one, StageSpans: stageSpans}, "v1")
			if err != nil || sdk.queue != nil || sdk.tp == nil {
				t.Fatalf("New with OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT: %+v, %v; want the SDK", sdk, err)
			}
			defer sdk.Shutdown(context.Background())
			t.Setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "")
			lean, err := New(context.Background(), Config{Enabled: true, Endpoint: leanEnd.URL, SamplerRatio: &one, StageSpans: stageSpans}, "v1")
			if err != nil || lean.queue == nil {
				t.Fatalf("New: %+v, %v; want the lean recorder", lean, err)
			}
			defer lean.Shutdown(context.Background())
			for _, tr := range []*Tracer{sdk, lean} {
				requestOps(t, tr)
				if err := tr.ForceFlush(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			want, got := normalized(t, sdkEnd), normalized(t, leanEnd)
			if !proto.Equal(got, want) {
				t.Fatalf("lean export\n%v\nSDK export\n%v", got, want)
			}
			n := 0
			for _, ss := range got.ResourceSpans[0].ScopeSpans {
				n += len(ss.Spans)
			}
			if wantN := map[bool]int{false: 5, true: 12}[stageSpans]; n != wantN {
				t.Errorf("%d spans exported; want %d", n, wantN)
			}
		})
	}
}

// blockingCollector answers an export only when release is closed; got
// counts the spans of the exports it answered.
type blockingCollector struct {
	URL     string
	arrived chan struct{} // an export arrived (capacity 16)
	release chan struct{}
	posts   atomic.Int32
}

func startBlockingCollector(t *testing.T) *blockingCollector {
	c := &blockingCollector{arrived: make(chan struct{}, 16), release: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.posts.Add(1)
		c.arrived <- struct{}{}
		<-c.release
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(srv.Close)
	c.URL = srv.URL
	return c
}

// With the collector stuck, ending spans never blocks: the queue keeps
// OTEL_BSP_MAX_QUEUE_SIZE records and drops the others, counted in
// Dropped and reported to the OpenTelemetry error handler (the node's log).
// The goroutine exports the queued ones once the collector answers and
// ends with Shutdown; spans ended after it are neither exported nor
// counted as drops.
func TestLeanQueueDropsWhenFull(t *testing.T) {
	var mu sync.Mutex
	var reported []string
	prev := otel.GetErrorHandler()
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { mu.Lock(); reported = append(reported, err.Error()); mu.Unlock() }))
	defer otel.SetErrorHandler(prev)

	t.Setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4")
	t.Setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2")
	col := startBlockingCollector(t)
	one := 1.0
	tr, err := New(context.Background(), Config{Enabled: true, Endpoint: col.URL, SamplerRatio: &one}, "")
	if err != nil || tr.queue == nil {
		t.Fatalf("New: %v, %v", tr, err)
	}
	end := func(n int) {
		for range n {
			_, s := tr.StartServer(http.Header{}, "POST", time.Now())
			s.End()
		}
	}
	end(2) // a full batch: the goroutine takes it and waits for the collector
	select {
	case <-col.arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("no export of a full batch")
	}
	done := make(chan struct{})
	go func() { end(10); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("ending spans blocked on a stuck collector")
	}
	if d := tr.Dropped(); d != 6 {
		t.Errorf("dropped %d; want 6 (10 ended, 4 queued)", d)
	}
	close(col.release)
	if err := tr.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if p := col.posts.Load(); p != 3 { // the first batch, then the 4 queued in batches of 2
		t.Errorf("%d exports; want 3", p)
	}
	mu.Lock()
	if len(reported) != 1 || !strings.Contains(reported[0], "6 spans dropped") {
		t.Errorf("reported %q; want one error naming the 6 drops", reported)
	}
	mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-tr.queue.done:
	default:
		t.Fatal("the export goroutine runs after Shutdown")
	}
	end(3)
	if d := tr.Dropped(); d != 6 {
		t.Errorf("dropped %d after Shutdown; want still 6", d)
	}
	if err := tr.ForceFlush(context.Background()); err != nil || col.posts.Load() != 3 {
		t.Errorf("flush after Shutdown: %v, %d exports; want nil, 3", err, col.posts.Load())
	}
}

// New uses the lean recorder only for what it implements; the rest keeps
// the SDK.
func TestLeanOnlyWhenImplemented(t *testing.T) {
	one := 1.0
	end := startCapture(t)
	for _, c := range []struct {
		name     string
		env      [2]string
		cfg      Config
		wantLean bool
	}{
		{"http endpoint, ratio", [2]string{}, Config{Endpoint: end.URL, SamplerRatio: &one}, true},
		{"http endpoint, default sampler", [2]string{}, Config{Endpoint: end.URL}, true},
		{"OTEL_TRACES_SAMPLER", [2]string{"OTEL_TRACES_SAMPLER", "always_off"}, Config{Endpoint: end.URL}, false},
		{"OTEL_TRACES_SAMPLER under sampler_ratio", [2]string{"OTEL_TRACES_SAMPLER", "always_off"}, Config{Endpoint: end.URL, SamplerRatio: &one}, true},
		{"limits", [2]string{"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "10"}, Config{Endpoint: end.URL}, false},
		{"compression", [2]string{"OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"}, Config{Endpoint: end.URL}, false},
		{"grpc", [2]string{}, Config{Endpoint: "http://127.0.0.1:1", Protocol: ProtocolGRPC}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.env[0] != "" {
				t.Setenv(c.env[0], c.env[1])
			}
			c.cfg.Enabled = true
			tr, err := New(context.Background(), c.cfg, "")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			defer tr.Shutdown(ctx)
			if lean := tr.queue != nil; lean != c.wantLean || lean == (tr.tp != nil) {
				t.Errorf("lean %v, SDK %v; want lean %v", lean, tr.tp != nil, c.wantLean)
			}
		})
	}
}
