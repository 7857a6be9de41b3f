package tracing

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// The vectors are from W3C Trace Context Level 1
// (https://www.w3.org/TR/trace-context-1/), by section title, and from
// the cases of its test suite (w3c/trace-context test/test.py) that they
// mirror.
const (
	tid0 = "4bf92f3577b34da6a3ce929d0e0e4736"
	sid0 = "00f067aa0ba902b7"
)

var traceparentVectors = []struct {
	name, in string
	ok       bool
	flags    trace.TraceFlags
}{
	// "Examples of HTTP traceparent Headers"
	{"example sampled", "00-" + tid0 + "-" + sid0 + "-01", true, 1},
	{"example not sampled", "00-" + tid0 + "-" + sid0 + "-00", true, 0},
	{"random flag (Level 2) kept", "00-" + tid0 + "-" + sid0 + "-02", true, 2},
	{"sampled and random", "00-" + tid0 + "-" + sid0 + "-03", true, 3},
	// "version": 2 HEXDIGLC, ff invalid
	{"version ff", "ff-" + tid0 + "-" + sid0 + "-01", false, 0},
	{"version upper case", "0A-" + tid0 + "-" + sid0 + "-01", false, 0},
	{"version not hex", "0g-" + tid0 + "-" + sid0 + "-01", false, 0},
	{"version one digit", "0-" + tid0 + "-" + sid0 + "-01", false, 0},
	// "version-format": version 00 is exactly these fields
	{"00 with a trailing dash", "00-" + tid0 + "-" + sid0 + "-01-", false, 0},
	{"00 with more fields", "00-" + tid0 + "-" + sid0 + "-01-what-the-future-will-be-like", false, 0},
	{"00 too short", "00-" + tid0 + "-" + sid0 + "-1", false, 0},
	{"00 with a space", "00-" + tid0 + "-" + sid0 + "-01 ", false, 0},
	// "trace-id": 32 HEXDIGLC, not all zero
	{"trace-id all zero", "00-00000000000000000000000000000000-" + sid0 + "-01", false, 0},
	{"trace-id upper case", "00-" + strings.ToUpper(tid0) + "-" + sid0 + "-01", false, 0},
	{"trace-id not hex", "00-4bf92f3577b34da6a3ce929d0e0e473g-" + sid0 + "-01", false, 0},
	{"trace-id short", "00-4bf92f3577b34da6a3ce929d0e0e473-" + sid0 + "-01", false, 0},
	{"trace-id long", "00-4bf92f3577b34da6a3ce929d0e0e47366-" + sid0 + "-01", false, 0},
	// "parent-id": 16 HEXDIGLC, not all zero
	{"parent-id all zero", "00-" + tid0 + "-0000000000000000-01", false, 0},
	{"parent-id upper case", "00-" + tid0 + "-00F067AA0BA902B7-01", false, 0},
	{"parent-id short", "00-" + tid0 + "-00f067aa0ba902b-01", false, 0},
	// "trace-flags": 2 HEXDIGLC; the propagator rejects other flags than
	// sampled and random in version 00 (they "MUST be set to zero")
	{"flags upper case", "00-" + tid0 + "-" + sid0 + "-0A", false, 0},
	{"flags not hex", "00-" + tid0 + "-" + sid0 + "-0x", false, 0},
	{"00 with reserved flags", "00-" + tid0 + "-" + sid0 + "-09", false, 0},
	// "Versioning of traceparent": a higher version is read by its first
	// 55 characters, followed by the end or a dash
	{"future version", "cc-" + tid0 + "-" + sid0 + "-01", true, 1},
	{"future version more fields", "cc-" + tid0 + "-" + sid0 + "-01-what-the-future-will-be-like", true, 1},
	{"future version reserved flags", "cc-" + tid0 + "-" + sid0 + "-09", true, 1},
	{"future version flags not ended", "cc-" + tid0 + "-" + sid0 + "-01.what-the-future-will-be-like", false, 0},
	{"future version shorter than 55", "cc-" + tid0 + "-" + sid0 + "-1", false, 0},
	{"future version bad trace-id", "cc-" + strings.ToUpper(tid0) + "-" + sid0 + "-01", false, 0},
	// delimiters
	{"no delimiters", "00" + tid0 + sid0 + "01", false, 0},
	{"wrong delimiter", "00_" + tid0 + "_" + sid0 + "_01", false, 0},
	{"empty", "", false, 0},
}

func TestParseTraceparentVectors(t *testing.T) {
	for _, c := range traceparentVectors {
		tid, sid, flags, ok := parseTraceparent(c.in)
		if ok != c.ok || flags != c.flags {
			t.Errorf("%s: %q: ok %v flags %v; want %v %v", c.name, c.in, ok, flags, c.ok, c.flags)
			continue
		}
		if ok && (tid.String() != tid0 || sid.String() != sid0) {
			t.Errorf("%s: ids %s %s; want %s %s", c.name, tid, sid, tid0, sid0)
		}
	}
}

// member is n list-members k0=v,k1=v,…
func members(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("k")
		b.WriteString(strings.Repeat("x", i))
		b.WriteString("=v")
	}
	return b.String()
}

var tracestateVectors = []struct{ name, in, want string }{
	// "tracestate Header Field Values", "list", "Key", "Value"
	{"example", "congo=t61rcWkgMzE", "congo=t61rcWkgMzE"},
	{"two members", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"},
	{"multi-tenant key", "fw529a3039@dt=ZmxhZ3M9MA,congo=1", "fw529a3039@dt=ZmxhZ3M9MA,congo=1"},
	{"key with all key chars", "a0_-*/z=1", "a0_-*/z=1"},
	{"value with inner space", "a=x y", "a=x y"},
	{"value with every chr", "a= !\"#$%&'()*+-./09:;<>?@AZ[\\]^_`az{|}~", "a= !\"#$%&'()*+-./09:;<>?@AZ[\\]^_`az{|}~"},
	// optional white space and empty members are dropped (as the propagator)
	{"OWS after comma", "a=1, b=2", "a=1,b=2"},
	{"tabs and spaces", "\ta=1 ,\t b=2\t", "a=1,b=2"},
	{"empty members", ",a=1,,b=2,", "a=1,b=2"},
	{"only commas", ",,", ""},
	// invalid: dropped whole
	{"upper-case key", "Congo=1", ""},
	{"key starts with a digit", "0a=1", ""},
	{"no equals", "congo", ""},
	{"empty value", "congo=", ""},
	{"value with comma-less equals", "a=b=c", ""},
	{"value ends with a space inside", "a=1 ,b", ""},
	{"duplicate key", "a=1,b=2,a=3", ""},
	{"non-ASCII key", "é=1", ""},
	{"value with a control char", "a=1\x01", ""},
	{"tenant too long", strings.Repeat("t", 242) + "@s=1", ""},
	{"tenant 241", strings.Repeat("t", 241) + "@s=1", strings.Repeat("t", 241) + "@s=1"},
	{"system too long", "t@" + strings.Repeat("s", 15) + "=1", ""},
	{"system 14", "t@" + strings.Repeat("s", 14) + "=1", "t@" + strings.Repeat("s", 14) + "=1"},
	{"two @", "t@s@x=1", ""},
	// "tracestate Limits" (as the propagator: 32 members, 256-char keys and values, no truncation)
	{"32 members", members(32), members(32)},
	{"33 members", members(33), ""},
	{"key 256", strings.Repeat("k", 256) + "=1", strings.Repeat("k", 256) + "=1"},
	{"key 257", strings.Repeat("k", 257) + "=1", ""},
	{"value 256", "k=" + strings.Repeat("v", 256), "k=" + strings.Repeat("v", 256)},
	{"value 257", "k=" + strings.Repeat("v", 257), ""},
	{"over 512 characters kept", "a=" + strings.Repeat("v", 256) + ",b=" + strings.Repeat("v", 256) + ",c=1", "a=" + strings.Repeat("v", 256) + ",b=" + strings.Repeat("v", 256) + ",c=1"},
}

func TestTracestateVectors(t *testing.T) {
	for _, c := range tracestateVectors {
		got := tracestateOf(c.in)
		if got != c.want {
			t.Errorf("%s: tracestateOf(%q) = %q; want %q", c.name, c.in, got, c.want)
		}
		if got == c.in && got != "" && unsafe.StringData(got) != unsafe.StringData(c.in) {
			t.Errorf("%s: a valid tracestate was copied; want it passed on as received", c.name)
		}
	}
}

// headerCases are header sets for the comparisons with the propagator:
// every traceparent vector with and without each tracestate vector's
// value, repeated fields, and odd cases.
func headerCases() []http.Header {
	var hs []http.Header
	for _, tp := range traceparentVectors {
		hs = append(hs, http.Header{"Traceparent": {tp.in}})
		for _, ts := range tracestateVectors {
			hs = append(hs, http.Header{"Traceparent": {tp.in}, "Tracestate": {ts.in}})
		}
	}
	ok := traceparentVectors[0].in
	return append(hs, http.Header{}, http.Header{"Tracestate": {"a=1"}},
		http.Header{"Traceparent": {ok, "00-" + tid0 + "-b7ad6b7169203331-00"}},
		http.Header{"Traceparent": {"", ok}},
		http.Header{"Traceparent": {ok}, "Tracestate": {"a=1", "b=2"}},
		http.Header{"Traceparent": {ok}, "Tracestate": {"bad", "b=2"}})
}

// propagatorParent is the parent the propagator reads in h, except where
// it departs from the spec: it accepts a version-00 traceparent followed
// by a single "-" (strings.Cut leaves nothing after the flags' field),
// which "version-format" (and the W3C test suite's
// test_traceparent_version_0x00) reject, as parseTraceparent does.
func propagatorParent(h http.Header) trace.SpanContext {
	if tp := h.Get("Traceparent"); len(tp) == 56 && tp[:2] == "00" && tp[55] == '-' {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(h)))
}

// The propagator's one departure from the spec, which propagatorParent
// leaves out: still there in this version of otel.
func TestPropagatorTrailingDash(t *testing.T) {
	h := http.Header{"Traceparent": {"00-" + tid0 + "-" + sid0 + "-01-"}}
	if !trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(h))).IsValid() {
		t.Log("the propagator now rejects a version-00 traceparent with a trailing dash: propagatorParent's exception can go")
	}
	if sc, _ := remoteParent(h); sc.IsValid() {
		t.Errorf("%q accepted; want it ignored (version 00 is 55 characters)", h)
	}
}

// sameParent fails t unless remoteParent reads h as the propagator does:
// the same span context (ids, flags, remote) and tracestate.
func sameParent(t *testing.T, h http.Header) {
	t.Helper()
	want := propagatorParent(h)
	got, ts := remoteParent(h)
	if !got.Equal(want.WithTraceState(trace.TraceState{})) || got.IsRemote() != want.IsRemote() || ts != want.TraceState().String() {
		t.Errorf("%q: %v %v tracestate %q; want %v %v %q", h, got, got.IsRemote(), ts, want, want.IsRemote(), want.TraceState().String())
	}
}

// TestParentMatchesPropagator runs the same headers through
// propagation.TraceContext's Extract and remoteParent.
func TestParentMatchesPropagator(t *testing.T) {
	for _, h := range headerCases() {
		sameParent(t, h)
	}
}

// FuzzParentMatchesPropagator: for any traceparent and tracestate,
// remoteParent reads what the propagator reads.
//
//	go test -run '^$' -fuzz FuzzParentMatchesPropagator -fuzztime 60s ./proxy/tracing/
func FuzzParentMatchesPropagator(f *testing.F) {
	for _, tp := range traceparentVectors {
		f.Add(tp.in, "")
	}
	for _, ts := range tracestateVectors {
		f.Add(traceparentVectors[0].in, ts.in)
	}
	f.Fuzz(func(t *testing.T, tp, ts string) {
		sameParent(t, http.Header{"Traceparent": {tp}, "Tracestate": {ts}})
	})
}

// The lean recorder continues a client's trace as the SDK (with the
// propagator) does, and Inject writes what the propagator writes for the
// span: for every header case.
func TestInjectLeanMatchesPropagator(t *testing.T) {
	one := 1.0
	tr, err := New(context.Background(), Config{Enabled: true, Endpoint: "http://127.0.0.1:1", SamplerRatio: &one}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer shutdownSoon(tr)
	for _, h := range headerCases() {
		var s, c Span
		tr.StartRequest(&s, h, "POST", time.Now())
		tr.StartChild(&c, &s, "upstream", trace.SpanKindClient, time.Now())
		psc := propagatorParent(h)
		if psc.IsValid() && (c.TraceID() != psc.TraceID() || c.SpanContext().TraceState().String() != psc.TraceState().String() ||
			c.SpanContext().IsSampled() != psc.IsSampled() || c.SpanContext().TraceFlags()&trace.FlagsRandom != psc.TraceFlags()&trace.FlagsRandom) {
			t.Errorf("%q: child %v; want the trace of %v", h, c.SpanContext(), psc)
		}
		want := http.Header{}
		propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), c.SpanContext()), propagation.HeaderCarrier(want))
		got := h.Clone()
		tr.Inject(&c, got)
		tr.Inject(&c, got) // a second time (a retried request's header): the same
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%q: injected %q; want %q", h, got, want)
		}
		c.End()
		s.End()
	}
}

func shutdownSoon(tr *Tracer) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	tr.Shutdown(ctx)
}

// TestSamplerMatchesSDK: the lean recorder's sampling decision is that of
// the SDK's ParentBased(TraceIDRatioBased(ratio)) (ParentBased(AlwaysSample())
// without a ratio) for roots and for sampled and unsampled parents.
func TestSamplerMatchesSDK(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, ratio := range []*float64{nil, ptr(0.0), ptr(1e-9), ptr(0.25), ptr(0.5), ptr(0.999), ptr(1.0)} {
		tr, err := New(context.Background(), Config{Enabled: true, Endpoint: "http://127.0.0.1:1", SamplerRatio: ratio}, "")
		if err != nil {
			t.Fatal(err)
		}
		sdk := sdktrace.ParentBased(sdktrace.AlwaysSample())
		if ratio != nil {
			sdk = sdktrace.ParentBased(sdktrace.TraceIDRatioBased(*ratio))
		}
		sampled := 0
		for i := range 4000 {
			var tid trace.TraceID
			binary.NativeEndian.PutUint64(tid[:8], r.Uint64())
			binary.NativeEndian.PutUint64(tid[8:], r.Uint64())
			var psc trace.SpanContext
			if i%4 != 0 { // a parent, sampled or not, remote or local
				psc = trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: trace.SpanID{1}, TraceFlags: trace.TraceFlags(i % 2), Remote: i%4 == 1})
			}
			want := sdk.ShouldSample(sdktrace.SamplingParameters{ParentContext: trace.ContextWithSpanContext(context.Background(), psc), TraceID: tid}).Decision == sdktrace.RecordAndSample
			if got := tr.sampled(psc, tid); got != want {
				t.Fatalf("ratio %v, parent %v, trace id %v: sampled %v; want %v", ratio, psc, tid, got, want)
			}
			if want {
				sampled++
			}
		}
		if ratio != nil {
			t.Logf("ratio %v: %d of 4000 sampled", *ratio, sampled)
		}
		shutdownSoon(tr)
	}
}

// A request's trace as the pipeline makes it (server span continuing a
// client's traceparent and tracestate, an upstream span injected into
// the backend's header, stage events, attributes, the ends) allocates
// nothing once the recorder's records are warm; sampled out too.
func TestRequestTraceAllocatesNothing(t *testing.T) {
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "3600000") // no export during the runs (it allocates)
	for _, ratio := range []float64{1, 0} {
		tr, err := New(context.Background(), Config{Enabled: true, Endpoint: "http://127.0.0.1:1", SamplerRatio: &ratio}, "")
		if err != nil {
			t.Fatal(err)
		}
		in := http.Header{"Traceparent": {"00-" + tid0 + "-" + sid0 + "-01"}, "Tracestate": {"congo=t61rcWkgMzE"}}
		if ratio == 0 {
			delete(in, "Traceparent") // a root, sampled out
		}
		out := http.Header{}
		finish := attribute.StringSlice("gen_ai.response.finish_reasons", []string{"stop"}) // made once, as the pipeline's
		type request struct {
			s, c Span
			tp   Traceparent
		}
		reqs := make([]request, 150) // a request's spans are never reused: each run its own
		i := 0
		allocs := testing.AllocsPerRun(100, func() {
			q := &reqs[i]
			i++
			t0 := time.Now()
			tr.StartRequest(&q.s, in, "POST", t0)
			tr.StartChild(&q.c, &q.s, "upstream", trace.SpanKindClient, t0, attribute.String("server.address", "127.0.0.1"))
			tr.InjectTo(&q.c, out, &q.tp)
			q.c.AddEventAt("first_token", t0)
			q.c.EndAt(time.Time{})
			marks := [2]Mark{{Name: "auth", Start: t0, End: t0}, {Name: "prefill", Start: t0, End: t0}}
			tr.StagesOf(&q.s, marks[:])
			q.s.SetName("POST main")
			attrs := [2]attribute.KeyValue{attribute.Int("http.response.status_code", 200), finish}
			q.s.SetAttrs(attrs[:])
			q.s.EndAt(time.Time{})
		})
		if allocs != 0 {
			t.Errorf("ratio %v: %v allocations per request; want 0", ratio, allocs)
		}
		if ratio == 1 && (out.Get("Tracestate") != "congo=t61rcWkgMzE" || !strings.HasPrefix(out.Get("Traceparent"), "00-"+tid0+"-")) {
			t.Errorf("injected %q; want the client's trace and tracestate", out)
		}
		shutdownSoon(tr)
	}
}

func ptr[T any](v T) *T { return &v }
