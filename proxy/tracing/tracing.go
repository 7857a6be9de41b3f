package tracing

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Protocols of the OTLP exporter (the values of the standard
// OTEL_EXPORTER_OTLP_PROTOCOL variable that Sluice supports).
const (
	ProtocolHTTP = "http/protobuf"
	ProtocolGRPC = "grpc"
)

// Config is the tracing section of the config file. Every field left
// empty is taken from the standard OTEL_* environment variables, as the
// SDK reads them, and else from the SDK's defaults.
type Config struct {
	// Enabled turns tracing on. Off by default; OTEL_SDK_DISABLED=true
	// turns it off whatever this says.
	Enabled bool `yaml:"enabled"`
	// Endpoint is the collector's OTLP endpoint as a URL:
	// "http://collector:4318" (http/protobuf; the path /v1/traces is
	// added when the URL has none) or "http://collector:4317" (grpc).
	// Empty: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT,
	// else localhost:4318 (http) or localhost:4317 (grpc).
	Endpoint string `yaml:"endpoint"`
	// Protocol is "http/protobuf" or "grpc". Empty:
	// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL, else
	// http/protobuf.
	Protocol string `yaml:"protocol"`
	// SamplerRatio samples that fraction of the traces Sluice starts
	// (0..1), and follows the client's sampled flag when it sent a
	// traceparent (parent-based ratio). Nil: OTEL_TRACES_SAMPLER and
	// OTEL_TRACES_SAMPLER_ARG, else parentbased_always_on.
	SamplerRatio *float64 `yaml:"sampler_ratio"`
	// Headers are sent with every export (e.g. a collector's API key),
	// instead of OTEL_EXPORTER_OTLP_(TRACES_)HEADERS.
	Headers map[string]string `yaml:"headers"`
	// Insecure exports without TLS (an http:// endpoint URL already
	// means so).
	Insecure bool `yaml:"insecure"`
	// ServiceName is the resource's service.name. Empty:
	// OTEL_SERVICE_NAME, else "sluice".
	ServiceName string `yaml:"service_name"`
	// StageSpans records each stage (auth, recv, route, limit, queue,
	// prefill, decode) as a child span of the request's span, drawn as a
	// waterfall by trace viewers. Off (the default), each stage is an
	// event on the request's span at the stage's end, and the durations
	// are in its sluice.server_timing attribute: cheaper (see
	// docs/TIMING.md "Traces").
	StageSpans bool `yaml:"stage_spans"`
	// StageEvents, when false, records no stage events: the stages'
	// durations are then only in the request span's sluice.server_timing
	// attribute, the cheapest trace (see docs/TIMING.md "Traces"). Nil
	// means true. StageSpans wins over it.
	StageEvents *bool `yaml:"stage_events"`
}

// Validate reports what is wrong with an enabled c.
func (c Config) Validate() error {
	var errs []error
	switch c.Protocol {
	case "", ProtocolHTTP, ProtocolGRPC:
	default:
		errs = append(errs, fmt.Errorf("protocol %q: want %q or %q", c.Protocol, ProtocolHTTP, ProtocolGRPC))
	}
	if r := c.SamplerRatio; r != nil && !(*r >= 0 && *r <= 1) {
		errs = append(errs, fmt.Errorf("sampler_ratio %v: want 0 to 1", *r))
	}
	if c.Endpoint != "" {
		if u, err := url.Parse(c.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("endpoint %q: want a URL such as http://collector:4318", c.Endpoint))
		}
	}
	return errors.Join(errs...)
}

// Tracer makes Sluice's spans; it is safe for simultaneous use by
// multiple goroutines.
//
// Over OTLP/HTTP with the wire exporter (the common case) it records the
// spans itself, the lean recorder (span.go, batch.go): pooled records fed
// to the wire encoder by one export goroutine, which the Tracer owns and
// Shutdown ends after flushing what is queued. It costs about a third of
// the SDK's CPU per request (docs/TIMING.md "Traces"). What the lean
// recorder does not implement keeps the OpenTelemetry SDK, as before:
// OTLP/gRPC and otlptracehttp's fallbacks (TLS files, compression, the
// default endpoint), OTEL_TRACES_SAMPLER when the config has no
// sampler_ratio, and the OTEL_*_LIMIT variables.
type Tracer struct {
	// The lean recorder: queue is nil when the SDK is used. Its sampler
	// is parent-based (see sampled).
	queue     *exportQueue
	rootAll   bool   // a root span is always sampled (no ratio, or ratio ≥ 1)
	rootBound uint64 // else sampled when its trace id's low 63 bits are below this

	// The SDK, when the lean recorder is not.
	tp *sdktrace.TracerProvider
	tr trace.Tracer

	prop   propagation.TraceContext
	stages bool // Config.StageSpans
	events bool // Config.StageEvents
}

// scopeName is the instrumentation scope of Sluice's spans.
const scopeName = "github.com/sluice-proxy/sluice/proxy"

// New starts tracing as c says: nil (tracing off) when c is not enabled or
// OTEL_SDK_DISABLED is true. version is the service.version.
func New(ctx context.Context, c Config, version string) (*Tracer, error) {
	if !c.Enabled || strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return nil, nil
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var lean *wireExporter
	if leanConfig(c) {
		lean = newWireExporter(c)
	}
	var exp sdktrace.SpanExporter
	if lean == nil {
		var err error
		if exp, err = newExporter(ctx, c); err != nil {
			return nil, fmt.Errorf("tracing: %w", err)
		}
	}
	name := c.ServiceName
	if name == "" {
		name = "sluice"
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", name)}
	if version != "" {
		attrs = append(attrs, attribute.String("service.version", version))
	}
	opts := []resource.Option{resource.WithAttributes(attrs...), resource.WithTelemetrySDK()}
	if c.ServiceName == "" {
		opts = append(opts, resource.WithFromEnv()) // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
	}
	res, err := resource.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	t := &Tracer{stages: c.StageSpans, events: c.StageEvents == nil || *c.StageEvents}
	if lean != nil {
		t.rootAll = c.SamplerRatio == nil || *c.SamplerRatio >= 1 // nil: the SDK's default, parentbased_always_on
		if !t.rootAll && *c.SamplerRatio > 0 {
			t.rootBound = uint64(*c.SamplerRatio * (1 << 63)) // as sdktrace.TraceIDRatioBased
		}
		t.queue = newExportQueue(lean, res, instrumentation.Scope{Name: scopeName})
		return t, nil
	}
	tpOpts := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp), sdktrace.WithResource(res)}
	if c.SamplerRatio != nil { // else the SDK reads OTEL_TRACES_SAMPLER(_ARG)
		tpOpts = append(tpOpts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(*c.SamplerRatio))))
	}
	t.tp = sdktrace.NewTracerProvider(tpOpts...)
	t.tr = t.tp.Tracer(scopeName)
	return t, nil
}

// sdkOnlyEnv are the variables that change what the SDK records, which the
// lean recorder does not implement: when one is set, the SDK is used.
var sdkOnlyEnv = []string{
	"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "OTEL_SPAN_EVENT_COUNT_LIMIT",
	"OTEL_SPAN_LINK_COUNT_LIMIT", "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT",
	"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_COUNT_LIMIT", "OTEL_GO_X_OBSERVABILITY",
}

// leanConfig reports whether the lean recorder can do what c and the
// environment ask: OTLP/HTTP (the wire exporter, when newWireExporter
// also agrees), a sampler it knows (sampler_ratio, or the default when
// OTEL_TRACES_SAMPLER is unset) and the SDK's default span limits.
func leanConfig(c Config) bool {
	if c.protocol() != ProtocolHTTP || c.SamplerRatio == nil && os.Getenv("OTEL_TRACES_SAMPLER") != "" {
		return false
	}
	for _, k := range sdkOnlyEnv {
		if os.Getenv(k) != "" {
			return false
		}
	}
	return true
}

// protocol is c's protocol, else the environment's, else http/protobuf.
func (c Config) protocol() string {
	if c.Protocol != "" {
		return c.Protocol
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return ProtocolHTTP
}

// newExporter makes c's exporter: for http/protobuf the wire exporter
// (wire.go) unless c or the environment needs otlptracehttp, for grpc
// otlptracegrpc.
func newExporter(ctx context.Context, c Config) (sdktrace.SpanExporter, error) {
	switch p := c.protocol(); p {
	case ProtocolGRPC:
		var opts []otlptracegrpc.Option
		if c.Endpoint != "" {
			opts = append(opts, otlptracegrpc.WithEndpointURL(c.Endpoint))
		}
		if c.Insecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
		if len(c.Headers) > 0 {
			opts = append(opts, otlptracegrpc.WithHeaders(c.Headers))
		}
		return otlptracegrpc.New(ctx, opts...)
	case ProtocolHTTP:
		if w := newWireExporter(c); w != nil {
			return w, nil
		}
		var opts []otlptracehttp.Option
		if c.Endpoint != "" {
			opts = append(opts, otlptracehttp.WithEndpointURL(c.Endpoint))
			if u, err := url.Parse(c.Endpoint); err == nil && (u.Path == "" || u.Path == "/") {
				opts = append(opts, otlptracehttp.WithURLPath("/v1/traces")) // a base URL, as OTEL_EXPORTER_OTLP_ENDPOINT
			}
		}
		if c.Insecure {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
		if len(c.Headers) > 0 {
			opts = append(opts, otlptracehttp.WithHeaders(c.Headers))
		}
		return otlptracehttp.New(ctx, opts...)
	default:
		return nil, fmt.Errorf("unsupported OTLP protocol %q (want %q or %q)", p, ProtocolHTTP, ProtocolGRPC)
	}
}

// Shutdown flushes the queued spans and stops the exporter; a nil Tracer
// does nothing.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	if t.queue != nil {
		err := t.queue.shutdown(ctx)
		t.queue.exp.Shutdown(context.Background())
		return err
	}
	return t.tp.Shutdown(ctx)
}

// Dropped is the number of spans the lean recorder dropped because its
// export queue was full (the SDK's drops are not counted here).
func (t *Tracer) Dropped() uint64 {
	if t == nil || t.queue == nil {
		return 0
	}
	return t.queue.dropped.Load()
}

// ForceFlush exports the spans ended so far.
func (t *Tracer) ForceFlush(ctx context.Context) error {
	if t == nil {
		return nil
	}
	if t.queue != nil {
		return t.queue.flush(ctx)
	}
	return t.tp.ForceFlush(ctx)
}

// StartServer starts a request's SERVER span at start, continuing the
// trace of h's traceparent and tracestate when they are valid. The
// returned context holds the span (the parent of Start's spans).
func (t *Tracer) StartServer(h http.Header, name string, start time.Time) (context.Context, *Span) {
	s := new(Span)
	t.StartRequest(s, h, name, start)
	if s.sdk != nil {
		return s.ctx, s
	}
	return trace.ContextWithSpan(context.Background(), s), s
}

// StartRequest is StartServer into s, a zero Span the caller owns (a
// field of its request's state: no allocation), without a context: start
// its children with StartChild and record its stages with StagesOf.
// With the lean recorder h's W3C headers are read by Sluice's own parser
// (w3c.go), else by the OpenTelemetry propagator.
func (t *Tracer) StartRequest(s *Span, h http.Header, name string, start time.Time) {
	if t.queue == nil {
		ctx := t.prop.Extract(context.Background(), canonicalCarrier(h))
		ctx, sdk := t.tr.Start(ctx, name, optServer, trace.WithTimestamp(start))
		*s = Span{sdk: sdk, ctx: ctx}
		return
	}
	psc, ts := remoteParent(h)
	t.initSpan(s, psc, ts, name, trace.SpanKindServer, start, nil)
}

// StartChild starts a child of parent into s, a zero Span the caller
// owns, as Start does.
func (t *Tracer) StartChild(s, parent *Span, name string, kind trace.SpanKind, start time.Time, attrs ...attribute.KeyValue) {
	if t.queue == nil {
		ctx, sdk := t.startSDK(parent.ctx, name, kind, start, attrs)
		*s = Span{sdk: sdk, ctx: ctx}
		return
	}
	t.initSpan(s, parent.sc, parent.ts, name, kind, start, attrs)
}

// parentOf is the span context and tracestate of the span in ctx.
func parentOf(ctx context.Context) (trace.SpanContext, string) {
	if p, ok := trace.SpanFromContext(ctx).(*Span); ok && p.sdk == nil {
		return p.sc, p.ts
	}
	psc := trace.SpanContextFromContext(ctx)
	return psc, psc.TraceState().String()
}

// newSpan starts a span of the lean recorder, a child of the span in
// parent.
func (t *Tracer) newSpan(parent context.Context, name string, kind trace.SpanKind, start time.Time, attrs []attribute.KeyValue) *Span {
	psc, ts := parentOf(parent)
	s := new(Span)
	t.initSpan(s, psc, ts, name, kind, start, attrs)
	return s
}

// initSpan starts a span of the lean recorder in s, as the SDK's tracer
// does (its newSpan and newRecordingSpan): the parent's trace id or a new
// one, a new span id (math/rand/v2 as the SDK's ID generator: per-thread
// state, no lock), the sampler's decision in the sampled flag, the
// parent's tracestate, a record only when sampled.
func (t *Tracer) initSpan(s *Span, psc trace.SpanContext, ts string, name string, kind trace.SpanKind, start time.Time, attrs []attribute.KeyValue) {
	tid := psc.TraceID()
	if !tid.IsValid() {
		for !tid.IsValid() {
			binary.NativeEndian.PutUint64(tid[:8], rand.Uint64())
			binary.NativeEndian.PutUint64(tid[8:], rand.Uint64())
		}
	}
	var sid trace.SpanID
	for !sid.IsValid() {
		binary.NativeEndian.PutUint64(sid[:], rand.Uint64())
	}
	sampled := t.sampled(psc, tid)
	flags := psc.TraceFlags() &^ trace.FlagsSampled
	if sampled {
		flags |= trace.FlagsSampled
	}
	*s = Span{t: t, sc: trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: flags}), ts: ts}
	if !sampled {
		return
	}
	if start.IsZero() {
		start = time.Now()
	}
	r := t.queue.get()
	r.sc, r.ts, r.parent, r.name, r.kind, r.start = s.sc, ts, psc, name, trace.ValidateSpanKind(kind), start
	r.setAttrs(attrs)
	s.rec = r
}

// sampled is the decision of the SDK's sampler
// ParentBased(TraceIDRatioBased(ratio)), or ParentBased(AlwaysSample())
// without a ratio (sdk/trace/sampling.go; TestSamplerMatchesSDK): a
// child of a valid parent, remote or local, is sampled when the parent
// is; a root when the ratio says so, by its trace id. Those samplers
// add no attributes and keep the parent's tracestate.
func (t *Tracer) sampled(psc trace.SpanContext, tid trace.TraceID) bool {
	if psc.IsValid() {
		return psc.IsSampled()
	}
	return t.rootAll || binary.BigEndian.Uint64(tid[8:16])>>1 < t.rootBound
}

// The span kinds as start options, made once (each trace.WithSpanKind
// call allocates).
var (
	optServer   = trace.WithSpanKind(trace.SpanKindServer)
	optKinds    = [...]trace.SpanStartOption{trace.WithSpanKind(0), trace.WithSpanKind(1), trace.WithSpanKind(2), trace.WithSpanKind(3), trace.WithSpanKind(4), trace.WithSpanKind(5)}
	optInternal = optKinds[trace.SpanKindInternal]
)

func kindOption(k trace.SpanKind) trace.SpanStartOption {
	if k >= 0 && int(k) < len(optKinds) {
		return optKinds[k]
	}
	return trace.WithSpanKind(k)
}

// canonicalCarrier reads and writes the W3C headers of an http.Header by
// their canonical keys: propagation.HeaderCarrier canonicalizes the
// propagator's lower-case names, an allocation per call.
type canonicalCarrier http.Header

func (c canonicalCarrier) Get(k string) string {
	var v []string
	switch k {
	case "traceparent":
		v = c["Traceparent"]
	case "tracestate":
		v = c["Tracestate"]
	default:
		return http.Header(c).Get(k)
	}
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

func (c canonicalCarrier) Set(k, v string) {
	switch k {
	case "traceparent":
		c["Traceparent"] = []string{v}
	case "tracestate":
		c["Tracestate"] = []string{v}
	default:
		http.Header(c).Set(k, v)
	}
}

func (c canonicalCarrier) Keys() []string { return propagation.HeaderCarrier(c).Keys() }

// Start starts a child of the span in parent.
func (t *Tracer) Start(parent context.Context, name string, kind trace.SpanKind, start time.Time, attrs ...attribute.KeyValue) *Span {
	if t.queue != nil {
		return t.newSpan(parent, name, kind, start, attrs)
	}
	ctx, s := t.startSDK(parent, name, kind, start, attrs)
	return &Span{sdk: s, ctx: ctx}
}

// startSDK starts a span with the SDK.
func (t *Tracer) startSDK(parent context.Context, name string, kind trace.SpanKind, start time.Time, attrs []attribute.KeyValue) (context.Context, trace.Span) {
	if len(attrs) == 0 {
		return t.tr.Start(parent, name, kindOption(kind), trace.WithTimestamp(start))
	}
	// a copy for the SDK: attrs stays on the caller's stack
	return t.tr.Start(parent, name, kindOption(kind), trace.WithTimestamp(start), trace.WithAttributes(cloneAttrs(attrs)...))
}

// StageSpans reports whether stages are child spans (else events).
func (t *Tracer) StageSpans() bool { return t.stages }

// StagesRecorded reports whether Stages records anything (stage spans or
// events): else the caller need not build the marks.
func (t *Tracer) StagesRecorded() bool { return t.stages || t.events }

// Mark is a finished stage of a request, from Start to End.
type Mark struct {
	Name       string
	Start, End time.Time
	Attrs      []attribute.KeyValue
}

// Stages records the finished stages of the request whose span is in
// parent: child spans from start to end, or events on the request's span
// at their end (the request span's sluice.server_timing attribute has the
// durations), or nothing when stage events are off.
func (t *Tracer) Stages(parent context.Context, marks []Mark) {
	if s, ok := trace.SpanFromContext(parent).(*Span); ok && (t.queue != nil || s.ctx != nil) {
		t.StagesOf(s, marks)
		return
	}
	t.stagesSDK(parent, marks)
}

// StagesOf is Stages for the request span s.
func (t *Tracer) StagesOf(s *Span, marks []Mark) {
	if t.queue == nil {
		t.stagesSDK(s.ctx, marks)
		return
	}
	if t.stages {
		for _, m := range marks {
			var c Span
			t.initSpan(&c, s.sc, s.ts, m.Name, trace.SpanKindInternal, m.Start, m.Attrs)
			c.EndAt(m.End)
		}
		return
	}
	if !t.events {
		return
	}
	s.mu.Lock() // once for the events (AddEventAt's each)
	if s.rec != nil {
		for _, m := range marks {
			at := m.End
			if at.IsZero() {
				at = time.Now()
			}
			s.rec.addEvent(m.Name, at, m.Attrs)
		}
	}
	s.mu.Unlock()
}

// stagesSDK is Stages with the SDK.
func (t *Tracer) stagesSDK(parent context.Context, marks []Mark) {
	if t.stages {
		for _, m := range marks {
			t.Span(parent, m.Name, m.Start, m.End, m.Attrs...)
		}
		return
	}
	if !t.events || len(marks) == 0 {
		return
	}
	// One slice of options for every event (AddEvent does not keep it):
	// each variadic call would allocate its own.
	span := trace.SpanFromContext(parent)
	opts := make([]trace.EventOption, 2*len(marks))
	for i, m := range marks {
		o := opts[2*i : 2*i+1]
		o[0] = trace.WithTimestamp(m.End)
		if len(m.Attrs) > 0 {
			o = opts[2*i : 2*i+2]
			o[1] = trace.WithAttributes(m.Attrs...)
		}
		span.AddEvent(m.Name, o...)
	}
}

// Stage records one finished stage, as Stages does.
func (t *Tracer) Stage(parent context.Context, name string, start, end time.Time, attrs ...attribute.KeyValue) {
	t.Stages(parent, []Mark{{Name: name, Start: start, End: end, Attrs: attrs}})
}

// Span records a finished child of the span in parent, from start to end.
func (t *Tracer) Span(parent context.Context, name string, start, end time.Time, attrs ...attribute.KeyValue) {
	if t.queue != nil {
		t.newSpan(parent, name, trace.SpanKindInternal, start, attrs).EndAt(end)
		return
	}
	var s trace.Span
	if len(attrs) == 0 {
		_, s = t.tr.Start(parent, name, optInternal, trace.WithTimestamp(start))
	} else {
		_, s = t.tr.Start(parent, name, optInternal, trace.WithTimestamp(start), trace.WithAttributes(cloneAttrs(attrs)...))
	}
	s.End(trace.WithTimestamp(end))
}

// Inject sets h's traceparent (and tracestate) to span's context, so the
// backend continues the trace under span. A tracestate copied from the
// client is replaced by the span's (the client's when it was valid). The
// headers are those propagation.TraceContext.Inject (otel v1.47.0,
// propagation/trace_context.go) writes, built without its context and
// header canonicalization (TestInjectMatchesPropagator).
func (t *Tracer) Inject(span trace.Span, h http.Header) {
	if s, ok := span.(*Span); ok && s.sdk == nil {
		s.inject(h, new(Traceparent))
		return
	}
	delete(h, "Tracestate")
	sc := span.SpanContext()
	if !sc.IsValid() {
		return
	}
	if ts := sc.TraceState().String(); ts != "" {
		h["Tracestate"] = []string{ts}
	}
	var b [55]byte
	tid, sid := sc.TraceID(), sc.SpanID()
	flags := [1]byte{byte(sc.TraceFlags() & (trace.FlagsSampled | trace.FlagsRandom))}
	b[0], b[1], b[2], b[35], b[52] = '0', '0', '-', '-', '-'
	hex.Encode(b[3:35], tid[:])
	hex.Encode(b[36:52], sid[:])
	hex.Encode(b[53:55], flags[:])
	h["Traceparent"] = []string{string(b[:])}
}

// InjectTo is Inject for span, the header's values kept in tp (see
// Traceparent) when span is the lean recorder's: no allocation.
func (t *Tracer) InjectTo(span *Span, h http.Header, tp *Traceparent) {
	if span.sdk == nil {
		span.inject(h, tp)
		return
	}
	t.Inject(span, h)
}

// TraceIDOf returns the trace id of a W3C traceparent header value
// (version 00 layout: 00-<32 hex>-<16 hex>-<2 hex>), or "" when v is not a
// valid one. It does not allocate: the result is a substring of v.
func TraceIDOf(v string) string {
	if len(v) < 55 || v[2] != '-' || v[35] != '-' || v[52] != '-' || v[:2] == "ff" {
		return ""
	}
	if len(v) > 55 && (v[:2] == "00" || v[55] != '-') {
		return ""
	}
	id := v[3:35]
	zero := true
	for i := 0; i < len(v); i++ {
		if i == 2 || i == 35 || i == 52 || i >= 55 {
			continue
		}
		c := v[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return ""
		}
		if i >= 3 && i < 35 && c != '0' {
			zero = false
		}
	}
	if zero || v[36:52] == "0000000000000000" {
		return ""
	}
	return id
}
