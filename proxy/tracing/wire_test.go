package tracing

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// capture is an OTLP/HTTP endpoint keeping the bodies and headers posted
// to it; status is its answer (200 when 0).
type capture struct {
	URL    string
	mu     sync.Mutex
	bodies [][]byte
	hdrs   []http.Header
	status atomic.Int32
}

func startCapture(t *testing.T) *capture {
	c := &capture{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		c.mu.Lock()
		c.bodies = append(c.bodies, b)
		c.hdrs = append(c.hdrs, r.Header.Clone())
		c.mu.Unlock()
		if s := c.status.Load(); s != 0 {
			w.WriteHeader(int(s))
			return
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(srv.Close)
	c.URL = srv.URL
	return c
}

func (c *capture) last(t *testing.T) (*coltrace.ExportTraceServiceRequest, http.Header) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.bodies) == 0 {
		t.Fatal("nothing posted")
	}
	var m coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(c.bodies[len(c.bodies)-1], &m); err != nil {
		t.Fatalf("decoding the export: %v", err)
	}
	return &m, c.hdrs[len(c.hdrs)-1]
}

// diffSpans are spans with every field and attribute type the SDK's
// transform handles, from two resources and three scopes, interleaved.
func diffSpans() []sdktrace.ReadOnlySpan {
	tid := trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36}
	ts, _ := trace.ParseTraceState("vendor=abc,other=x")
	sc := func(id byte, remote bool, st trace.TraceState) trace.SpanContext {
		return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: trace.SpanID{0, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, id},
			TraceFlags: trace.FlagsSampled, TraceState: st, Remote: remote})
	}
	res1 := resource.NewSchemaless(attribute.String("service.name", "sluice"), attribute.String("service.version", "bench"))
	res2 := resource.NewWithAttributes("https://opentelemetry.io/schemas/1.40.0", attribute.String("service.name", "other"))
	scope1 := instrumentation.Scope{Name: "github.com/sluice-proxy/sluice/proxy"}
	scope2 := instrumentation.Scope{Name: "s2", Version: "v1.2", SchemaURL: "https://example/schema",
		Attributes: attribute.NewSet(attribute.Bool("b", true))}
	long := strings.Repeat("x", 300) // lengths of 2 and 3 varint bytes
	t0 := time.Unix(1764770000, 123456789)
	all := []attribute.KeyValue{
		attribute.String("s", "v"), attribute.String("empty", ""), attribute.String("long", long),
		attribute.Bool("t", true), attribute.Bool("f", false), attribute.Int64("i", -42), attribute.Int("zero", 0),
		attribute.Float64("d", 2.5), attribute.Float64("dz", 0),
		attribute.StringSlice("ss", []string{"stop", "", "length"}), attribute.BoolSlice("bs", []bool{true, false}),
		attribute.Int64Slice("is", []int64{1, -2, 0}), attribute.Float64Slice("fs", []float64{0.5, 0}),
		attribute.StringSlice("ss0", nil),
	}
	stubs := tracetest.SpanStubs{
		{Name: "POST main", SpanContext: sc(1, false, ts), Parent: sc(9, true, trace.TraceState{}), SpanKind: trace.SpanKindServer,
			StartTime: t0, EndTime: t0.Add(time.Second), Attributes: all,
			Events: []sdktrace.Event{{Name: "auth", Time: t0.Add(time.Millisecond)}, {Name: "decode", Time: t0.Add(2 * time.Millisecond),
				Attributes: []attribute.KeyValue{attribute.Int64("gen_ai.usage.output_tokens", 12)}, DroppedAttributeCount: 2}},
			Status: sdktrace.Status{Code: codes.Error, Description: "upstream failed " + long}, DroppedAttributes: 3, DroppedEvents: 1,
			Resource: res1, InstrumentationScope: scope1},
		{Name: "upstream", SpanContext: sc(2, false, ts), Parent: sc(1, false, ts), SpanKind: trace.SpanKindClient,
			StartTime: t0, EndTime: t0.Add(time.Millisecond), Status: sdktrace.Status{Code: codes.Ok},
			Links:        []sdktrace.Link{{SpanContext: sc(7, true, ts), Attributes: []attribute.KeyValue{attribute.String("k", "v")}, DroppedAttributeCount: 1}},
			DroppedLinks: 2, Resource: res1, InstrumentationScope: scope1},
		{Name: "other", SpanContext: sc(3, false, trace.TraceState{}), SpanKind: trace.SpanKindInternal, StartTime: t0, EndTime: t0,
			Resource: res2, InstrumentationScope: scope2},
		{Name: "", SpanContext: sc(4, false, trace.TraceState{}), SpanKind: trace.SpanKind(99), StartTime: time.Time{}, EndTime: t0,
			Resource: res1, InstrumentationScope: scope2},
		{Name: "no scope", SpanContext: sc(5, false, trace.TraceState{}), SpanKind: trace.SpanKindProducer, StartTime: t0, EndTime: t0,
			Resource: res1},
		{Name: "again", SpanContext: sc(6, false, trace.TraceState{}), SpanKind: trace.SpanKindConsumer, StartTime: t0, EndTime: t0,
			Resource: res1, InstrumentationScope: scope1},
	}
	return stubs.Snapshots()
}

// TestWireExporterMatchesSDK exports the same spans with otlptracehttp
// v1.47.0 and with the wire exporter, decodes both bodies with the
// generated OTLP protobuf types and wants them equal (resource groups
// compared in any order: the SDK's come out of a map), for one
// representative request's trace and for spans of every field and
// attribute type from several resources and scopes.
func TestWireExporterMatchesSDK(t *testing.T) {
	ctx := context.Background()
	sdkEnd, wireEnd := startCapture(t), startCapture(t)
	sdk, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(sdkEnd.URL+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	defer sdk.Shutdown(ctx)
	wire := newWireExporter(Config{Endpoint: wireEnd.URL, Headers: map[string]string{"X-Key": "k1"}})
	if wire == nil {
		t.Fatal("no wire exporter for an http endpoint")
	}
	defer wire.Shutdown(ctx)

	// A real request's trace from the SDK, ended through a recorder.
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "sluice"))))
	tr := &Tracer{tp: tp, tr: tp.Tracer("github.com/sluice-proxy/sluice/proxy")}
	start := time.Now()
	sctx, s := tr.StartServer(http.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}, "POST", start)
	c := tr.Start(sctx, "upstream", trace.SpanKindClient, start, attribute.String("server.address", "127.0.0.1"), attribute.Int("server.port", 8000))
	c.AddEvent("first_token")
	c.End()
	tr.Stage(sctx, "decode", start, start.Add(time.Millisecond), attribute.Int64("gen_ai.usage.output_tokens", 12))
	s.SetAttributes(attribute.StringSlice("gen_ai.response.finish_reasons", []string{"stop"}))
	s.End()

	for name, spans := range map[string][]sdktrace.ReadOnlySpan{"request": rec.Ended(), "every field": diffSpans()} {
		if err := sdk.ExportSpans(ctx, spans); err != nil {
			t.Fatal(err)
		}
		if err := wire.ExportSpans(ctx, spans); err != nil {
			t.Fatal(err)
		}
		want, _ := sdkEnd.last(t)
		got, h := wireEnd.last(t)
		if h.Get("Content-Type") != "application/x-protobuf" || h.Get("X-Key") != "k1" {
			t.Errorf("%s: headers %v", name, h)
		}
		if len(got.ResourceSpans) != len(want.ResourceSpans) {
			t.Fatalf("%s: %d resource groups; want %d", name, len(got.ResourceSpans), len(want.ResourceSpans))
		}
		n := 0
		for _, w := range want.ResourceSpans {
			found := false
			for _, g := range got.ResourceSpans {
				if proto.Equal(g, w) {
					found = true
				}
			}
			if !found {
				t.Errorf("%s: the SDK's group\n%v\nis not in the wire exporter's:\n%v", name, w, got)
			}
			for _, ss := range w.ScopeSpans {
				n += len(ss.Spans)
			}
		}
		if n != len(spans) {
			t.Errorf("%s: %d spans compared; want %d", name, n, len(spans))
		}
	}
}

// TestWireExporterRetriesAndFails: a 503 is retried until the export's
// context ends, a 400 fails at once; both are errors for the batch
// processor to report.
func TestWireExporterRetriesAndFails(t *testing.T) {
	end := startCapture(t)
	wire := newWireExporter(Config{Endpoint: end.URL + "/custom/path"})
	spans := diffSpans()[:1]
	end.status.Store(503)
	ctx, cancel := context.WithTimeout(context.Background(), 350*time.Millisecond)
	defer cancel()
	if err := wire.ExportSpans(ctx, spans); err == nil {
		t.Fatal("503 until the deadline: no error")
	}
	end.mu.Lock()
	posts := len(end.bodies)
	end.mu.Unlock()
	if posts < 2 {
		t.Errorf("503: %d posts; want retries", posts)
	}
	end.status.Store(400)
	if err := wire.ExportSpans(context.Background(), spans); err == nil || !strings.Contains(err.Error(), "400") {
		t.Fatalf("400: %v; want an error naming it", err)
	}
	end.mu.Lock()
	if len(end.bodies) != posts+1 {
		t.Errorf("400 retried: %d posts; want %d", len(end.bodies), posts+1)
	}
	end.mu.Unlock()
	end.status.Store(0)
	if err := wire.ExportSpans(context.Background(), spans); err != nil {
		t.Fatal(err)
	}
	if m, _ := end.last(t); len(m.ResourceSpans) != 1 || len(m.ResourceSpans[0].ScopeSpans[0].Spans) != 1 {
		t.Fatalf("export %v", m)
	}
}

// TestWireExporterFallsBack: what only otlptracehttp does (TLS client
// files, compression, the default endpoint) keeps otlptracehttp.
func TestWireExporterFallsBack(t *testing.T) {
	if newWireExporter(Config{}) != nil {
		t.Error("no endpoint: wire exporter; want the SDK's default")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318/")
	if w := newWireExporter(Config{}); w == nil || w.url != "http://127.0.0.1:4318/v1/traces" {
		t.Errorf("OTEL_EXPORTER_OTLP_ENDPOINT: %+v", w)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:4318/x")
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "api-key=a%20b,x=y")
	if w := newWireExporter(Config{}); w == nil || w.url != "http://127.0.0.1:4318/x" || w.headers["api-key"] != "a b" {
		t.Errorf("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: %+v", w)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
	if newWireExporter(Config{Endpoint: "http://127.0.0.1:4318"}) != nil {
		t.Error("compression asked: wire exporter; want otlptracehttp")
	}
}

// TestWireExporterEarlyAnswer: a collector that refuses an export before
// reading it (the transport may still be sending the body after Do
// returns) must not see the next export's bytes written over the body
// being sent: with -race this is a data race on the reused buffer.
func TestWireExporterEarlyAnswer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "too large", http.StatusRequestEntityTooLarge) // body unread
	}))
	defer srv.Close()
	wire := newWireExporter(Config{Endpoint: srv.URL})
	defer wire.Shutdown(context.Background())
	big := tracetest.SpanStubs{{Name: "big", Attributes: []attribute.KeyValue{attribute.String("x", strings.Repeat("y", 4<<20))},
		Resource: resource.Empty()}}.Snapshots()
	for range 5 {
		if err := wire.ExportSpans(context.Background(), big); err == nil || !strings.Contains(err.Error(), "413") {
			t.Fatalf("export to a refusing collector: %v; want its 413", err)
		}
	}
}

// A string slice's encoding comes from stringSlices once seen: the same
// bytes as appendArray makes, different values kept apart, no allocation.
func TestStringSliceEncodingCached(t *testing.T) {
	vals := []attribute.Value{attribute.StringSliceValue([]string{"stop"}), attribute.StringSliceValue([]string{"length"}),
		attribute.StringSliceValue([]string{"stop", "length"}), attribute.StringSliceValue(nil), attribute.StringSliceValue([]string{""})}
	for round := range 2 {
		for _, v := range vals {
			want := appendArray(nil, v.AsStringSlice(), attribute.StringValue)
			if got := appendStringSlice(nil, v); !bytes.Equal(got, want) {
				t.Errorf("round %d, %v: %x; want %x", round, v.Emit(), got, want)
			}
		}
	}
	buf := make([]byte, 0, 64)
	if n := testing.AllocsPerRun(100, func() { buf = appendStringSlice(buf[:0], vals[0]) }); n != 0 {
		t.Errorf("%v allocations per encoding of a seen value; want 0", n)
	}
}

// The exporter's connections write an export's body straight from its
// buffer (exportConn.ReadFrom): the collector gets every byte, the
// exporter counts them as written directly, and an export of 200 kB
// allocates far less than the 32 KiB buffer net/http's copy would make
// for it (per export: a request, its header, a body reader, a response;
// not checked under the race detector).
func TestExportConnWritesBody(t *testing.T) {
	// The collector compares each body with the first without
	// allocating (it runs in this process, whose allocations are counted).
	var mu sync.Mutex
	var first []byte
	buf := make([]byte, 64<<10)
	bodies, bad := 0, 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		bodies++
		if first == nil {
			first, _ = io.ReadAll(r.Body)
			return
		}
		cmp := &compareWriter{want: first}
		io.CopyBuffer(cmp, r.Body, buf)
		if cmp.bad || len(cmp.want) != 0 {
			bad++
		}
	}))
	defer srv.Close()
	wire := newWireExporter(Config{Endpoint: srv.URL})
	defer wire.Shutdown(context.Background())
	spans := bytes.Repeat([]byte{0x12, 0x03, 'a', 'b', 'c'}, 40000) // 200 kB of fields
	res := resource.NewSchemaless(attribute.String("service.name", "t"))
	scope := instrumentation.Scope{Name: "s"}
	if err := wire.exportEncoded(context.Background(), spans, res, scope); err != nil { // warm: the connection, the buffer
		t.Fatal(err)
	}
	direct0 := wire.direct.Load()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	alloc0 := ms.TotalAlloc
	const n = 20
	for range n {
		if err := wire.exportEncoded(context.Background(), spans, res, scope); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&ms)
	perExport := (ms.TotalAlloc - alloc0) / n
	mu.Lock()
	defer mu.Unlock()
	if bodies != n+1 || bad != 0 || !bytes.Contains(first, spans) {
		t.Fatalf("collector got %d bodies, %d unlike the first, the first holding the spans: %v; want %d, 0, true",
			bodies, bad, bytes.Contains(first, spans), n+1)
	}
	if got, min := wire.direct.Load()-direct0, uint64(n*len(spans)); got < min {
		t.Errorf("%d body bytes written straight from the buffer; want at least %d", got, min)
	}
	if perExport >= 16<<10 && !raceEnabled { // the race detector's sync.Pools drop items: net/http allocates more

		t.Errorf("an export allocates %d bytes; want under 16 KiB (no 32 KiB copy buffer)", perExport)
	}
	t.Logf("%d bytes allocated per export of %d (exporter and collector)", perExport, len(first))
}

// compareWriter checks that what is written is want, consuming it.
type compareWriter struct {
	want []byte
	bad  bool
}

func (c *compareWriter) Write(p []byte) (int, error) {
	if c.bad || len(p) > len(c.want) || !bytes.Equal(p, c.want[:len(p)]) {
		c.bad = true
		return len(p), nil
	}
	c.want = c.want[len(p):]
	return len(p), nil
}
