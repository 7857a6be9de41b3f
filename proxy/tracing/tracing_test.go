package tracing

import (
	"context"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

func TestTraceIDOf(t *testing.T) {
	const id = "0af7651916cd43dd8448eb211c80319c"
	for _, c := range []struct{ in, want string }{
		{"00-" + id + "-b7ad6b7169203331-01", id},
		{"00-" + id + "-b7ad6b7169203331-00", id},
		{"01-" + id + "-b7ad6b7169203331-01-future", id}, // a later version may append fields
		{"00-" + id + "-b7ad6b7169203331-01-x", ""},      // version 00 may not
		{"ff-" + id + "-b7ad6b7169203331-01", ""},
		{"00-" + strings.ToUpper(id) + "-b7ad6b7169203331-01", ""},
		{"00-00000000000000000000000000000000-b7ad6b7169203331-01", ""},
		{"00-" + id + "-0000000000000000-01", ""},
		{"00-" + id + "-b7ad6b7169203331", ""},
		{"", ""},
		{"garbage", ""},
	} {
		if got := TraceIDOf(c.in); got != c.want {
			t.Errorf("TraceIDOf(%q) = %q; want %q", c.in, got, c.want)
		}
	}
}

func TestNewOffAndInvalid(t *testing.T) {
	if tr, err := New(context.Background(), Config{}, ""); tr != nil || err != nil {
		t.Fatalf("disabled: %v %v; want nil, nil", tr, err)
	}
	bad := 2.0
	if _, err := New(context.Background(), Config{Enabled: true, SamplerRatio: &bad}, ""); err == nil {
		t.Fatal("sampler_ratio 2 accepted")
	}
	if _, err := New(context.Background(), Config{Enabled: true, Protocol: "http/json"}, ""); err == nil {
		t.Fatal("protocol http/json accepted")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
	if _, err := New(context.Background(), Config{Enabled: true}, ""); err == nil || !strings.Contains(err.Error(), "http/json") {
		t.Fatalf("OTEL_EXPORTER_OTLP_PROTOCOL=http/json: %v; want an error naming it", err)
	}
}

// Inject replaces the traceparent and tracestate the client's headers
// brought with the span's: an invalid client tracestate is not passed on.
func TestInjectReplacesClientHeaders(t *testing.T) {
	one := 1.0
	tr, err := New(context.Background(), Config{Enabled: true, Endpoint: "http://127.0.0.1:1", SamplerRatio: &one}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		tr.Shutdown(ctx)
	}()
	in := http.Header{"Traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, "Tracestate": {"=bad=,,"}}
	ctx, s := tr.StartServer(in, "POST", time.Now())
	c := tr.Start(ctx, "upstream", trace.SpanKindClient, time.Now())
	out := in.Clone() // as copyRequestHeader passes the client's headers on
	tr.Inject(c, out)
	want := "00-0af7651916cd43dd8448eb211c80319c-" + c.SpanContext().SpanID().String() + "-01"
	if out.Get("Traceparent") != want || out.Values("Tracestate") != nil {
		t.Fatalf("injected %v; want traceparent %s and no tracestate", out, want)
	}
	c.End()
	s.End()
}

// TestInjectMatchesPropagator: Inject writes the headers
// propagation.TraceContext.Inject writes, for sampled and unsampled
// spans with and without a tracestate, and replaces a client's tracestate.
func TestInjectMatchesPropagator(t *testing.T) {
	tid := trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36}
	ts, _ := trace.ParseTraceState("vendor=abc,other=x")
	var tr Tracer
	for _, flags := range []trace.TraceFlags{0, trace.FlagsSampled, trace.FlagsSampled | trace.FlagsRandom, 0xff} {
		for _, st := range []trace.TraceState{{}, ts} {
			sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: trace.SpanID{1, 2, 3, 4, 5, 6, 7, 0xef}, TraceFlags: flags, TraceState: st})
			want := http.Header{}
			propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), propagation.HeaderCarrier(want))
			got := http.Header{"Tracestate": {"client=1"}, "X": {"y"}}
			tr.Inject(noopSpan{sc: sc}, got)
			want.Set("X", "y")
			if !reflect.DeepEqual(got, want) {
				t.Errorf("flags %v tracestate %q: %v; want %v", flags, st, got, want)
			}
		}
	}
	got := http.Header{"Tracestate": {"client=1"}}
	tr.Inject(noopSpan{}, got)
	if len(got) != 0 {
		t.Errorf("invalid span context: %v; want no headers", got)
	}
}

// TestExtractMatchesHeaderCarrier: the canonical carrier reads what
// propagation.HeaderCarrier reads.
func TestExtractMatchesHeaderCarrier(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, h := range []http.Header{
		{}, {"Traceparent": {tp}}, {"Traceparent": {tp}, "Tracestate": {"a=1,b=2"}}, {"Traceparent": {tp}, "Tracestate": {"bad state"}},
		{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"}}, {"Traceparent": {"garbage"}}, {"Traceparent": {"", tp}},
	} {
		p := propagation.TraceContext{}
		want := trace.SpanContextFromContext(p.Extract(context.Background(), propagation.HeaderCarrier(h)))
		got := trace.SpanContextFromContext(p.Extract(context.Background(), canonicalCarrier(h)))
		if !got.Equal(want) || got.IsRemote() != want.IsRemote() {
			t.Errorf("%v: %v; want %v", h, got, want)
		}
	}
}

type noopSpan struct {
	trace.Span
	sc trace.SpanContext
}

func (s noopSpan) SpanContext() trace.SpanContext { return s.sc }
