package tracing

import (
	"context"
	"net/http"
	"reflect"
	"sync"
	"time"
	"unsafe"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"
)

// The span limits of the lean recorder: the SDK's defaults (its
// span_limits.go), which New keeps only while no OTEL_*_LIMIT variable
// changes them (else it uses the SDK).
const (
	attrLimit  = 128 // attributes per span
	eventLimit = 128 // events per span
	linkLimit  = 128 // links per span
)

// Span is a span of a Sluice trace. With the lean recorder (see New) it
// holds the span's record until End hands the record to the export queue;
// else it wraps the SDK's span. It implements trace.Span; the methods
// AddEventAt, SetAttrs and EndAt do what AddEvent, SetAttributes and End
// do without the options' allocations. Safe for simultaneous use.
type Span struct {
	embedded.Span

	sdk trace.Span      // the SDK's span, when the Tracer uses the SDK
	ctx context.Context // with the SDK: a context holding sdk, for its children
	sc  trace.SpanContext
	ts  string // the tracestate (not in sc: a TraceState is a parsed list)
	t   *Tracer

	mu  sync.Mutex
	rec *record // while recording: from Start to End, nil when sampled out
}

// Traceparent is the storage of the W3C headers InjectTo writes into a
// request's header: the header's values are slices of v, v[0] a string
// over b's bytes. InjectTo writes them once; the caller must never hand
// the same Traceparent to InjectTo again, nor reuse its memory, while a
// request may still hold its header (a transport may read the header
// after RoundTrip returned, e.g. a write still under way when the
// request was cancelled): a fresh one per request, or one in memory that
// is itself never reused.
type Traceparent struct {
	b [55]byte
	v [2]string // traceparent, tracestate
}

// record is a span's data: taken from the export queue's free list (with
// the capacity of its slices), filled from Start to End, then encoded and
// put back. It has the methods of sdktrace.ReadOnlySpan
// the encoder reads (spanData).
type record struct {
	sc, parent   trace.SpanContext
	ts           string // sc's tracestate (sc has none)
	name         string
	kind         trace.SpanKind
	start, end   time.Time
	attrs        []attribute.KeyValue
	droppedAttrs int
	events       []sdktrace.Event
	evAttrs      []attribute.KeyValue // the events' attributes, one backing array
	droppedEvs   int
	links        []sdktrace.Link
	droppedLinks int
	status       sdktrace.Status
	enc          []byte // the encoding, made at the end (exportQueue.push)
}

// newRecord makes a record with room for a server span's attributes and
// stage events.
func newRecord() *record {
	return &record{attrs: make([]attribute.KeyValue, 0, 24), events: make([]sdktrace.Event, 0, 8), evAttrs: make([]attribute.KeyValue, 0, 4)}
}

// reset clears r for the free list, keeping its slices' capacity (the values
// are cleared: the free list must not keep the strings alive).
func (r *record) reset() {
	clear(r.attrs)
	clear(r.events)
	clear(r.evAttrs)
	*r = record{attrs: r.attrs[:0], events: r.events[:0], evAttrs: r.evAttrs[:0], enc: r.enc[:0]}
}

func (r *record) SpanContext() trace.SpanContext   { return r.sc }
func (r *record) Parent() trace.SpanContext        { return r.parent }
func (r *record) Name() string                     { return r.name }
func (r *record) SpanKind() trace.SpanKind         { return r.kind }
func (r *record) StartTime() time.Time             { return r.start }
func (r *record) EndTime() time.Time               { return r.end }
func (r *record) Attributes() []attribute.KeyValue { return r.attrs }
func (r *record) DroppedAttributes() int           { return r.droppedAttrs }
func (r *record) Events() []sdktrace.Event         { return r.events }
func (r *record) DroppedEvents() int               { return r.droppedEvs }
func (r *record) Links() []sdktrace.Link           { return r.links }
func (r *record) DroppedLinks() int                { return r.droppedLinks }
func (r *record) Status() sdktrace.Status          { return r.status }
func (r *record) setAttrs(attrs []attribute.KeyValue) {
	r.attrs, r.droppedAttrs = setAttrs(r.attrs, r.droppedAttrs, attrs)
}

// setAttrs sets attrs in have as the SDK's span does: an invalid one is
// dropped, a key already there takes the new value in its place, a new key
// is appended while there are fewer than attrLimit, else dropped.
func setAttrs(have []attribute.KeyValue, dropped int, attrs []attribute.KeyValue) ([]attribute.KeyValue, int) {
next:
	for _, a := range attrs {
		if !a.Valid() {
			dropped++
			continue
		}
		for i := range have {
			if have[i].Key == a.Key {
				have[i] = a
				continue next
			}
		}
		if len(have) >= attrLimit {
			dropped++
			continue
		}
		have = append(have, a)
	}
	return have, dropped
}

// addEvent appends an event as the SDK's span does: the oldest dropped
// beyond eventLimit; the attributes kept as given.
func (r *record) addEvent(name string, at time.Time, attrs []attribute.KeyValue) {
	if len(r.events) >= eventLimit {
		copy(r.events, r.events[1:])
		r.events = r.events[:len(r.events)-1]
		r.droppedEvs++
	}
	ev := sdktrace.Event{Name: name, Time: at}
	if len(attrs) > 0 {
		n := len(r.evAttrs)
		r.evAttrs = append(r.evAttrs, attrs...)
		ev.Attributes = r.evAttrs[n:len(r.evAttrs):len(r.evAttrs)]
	}
	r.events = append(r.events, ev)
}

var _ trace.Span = (*Span)(nil)

// SpanContext returns the span's context: valid also when sampled out.
// With the lean recorder its TraceState is parsed at each call (an
// allocation when there is one): TraceID reads the id alone.
func (s *Span) SpanContext() trace.SpanContext {
	if s.sdk != nil {
		return s.sdk.SpanContext()
	}
	if s.ts != "" {
		ts, _ := trace.ParseTraceState(s.ts) // valid: tracestateOf or TraceState.String made it
		return s.sc.WithTraceState(ts)
	}
	return s.sc
}

// TraceID is the span's trace id.
func (s *Span) TraceID() trace.TraceID {
	if s.sdk != nil {
		return s.sdk.SpanContext().TraceID()
	}
	return s.sc.TraceID()
}

// inject is Tracer.Inject for a span of the lean recorder, into tp.
func (s *Span) inject(h http.Header, tp *Traceparent) {
	appendTraceparent(tp.b[:0], s.sc.TraceID(), s.sc.SpanID(), s.sc.TraceFlags())
	tp.v = [2]string{unsafe.String(&tp.b[0], len(tp.b)), s.ts}
	h["Traceparent"] = tp.v[0:1:1]
	if s.ts != "" {
		h["Tracestate"] = tp.v[1:2:2]
	} else {
		delete(h, "Tracestate")
	}
}

// IsRecording reports whether the span records (sampled, not ended).
func (s *Span) IsRecording() bool {
	if s.sdk != nil {
		return s.sdk.IsRecording()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rec != nil
}

// End ends the span at the option's timestamp, else now.
func (s *Span) End(options ...trace.SpanEndOption) {
	if s.sdk != nil {
		s.sdk.End(options...)
		return
	}
	var at time.Time
	if len(options) > 0 {
		c := trace.NewSpanEndConfig(options...)
		at = c.Timestamp()
	}
	s.EndAt(at)
}

// EndAt ends the span at end, or now when end is zero, and queues its
// record for export.
func (s *Span) EndAt(end time.Time) {
	if s.sdk != nil {
		if end.IsZero() {
			s.sdk.End()
		} else {
			s.sdk.End(trace.WithTimestamp(end))
		}
		return
	}
	s.mu.Lock()
	r := s.rec
	s.rec = nil
	s.mu.Unlock()
	if r == nil {
		return
	}
	if end.IsZero() {
		end = r.start.Add(time.Since(r.start)) // monotonic, as the SDK's
	}
	r.end = end
	s.t.queue.push(r)
}

// AddEvent adds an event at the option's timestamp, else now.
func (s *Span) AddEvent(name string, options ...trace.EventOption) {
	if s.sdk != nil {
		s.sdk.AddEvent(name, options...)
		return
	}
	c := trace.NewEventConfig(options...) // the timestamp is now when none is given
	s.AddEventAt(name, c.Timestamp(), c.Attributes()...)
}

// AddEventAt adds an event at at (now when zero).
func (s *Span) AddEventAt(name string, at time.Time, attrs ...attribute.KeyValue) {
	if s.sdk != nil {
		if at.IsZero() {
			at = time.Now()
		}
		s.sdk.AddEvent(name, trace.WithTimestamp(at), trace.WithAttributes(cloneAttrs(attrs)...))
		return
	}
	if at.IsZero() {
		at = time.Now()
	}
	s.mu.Lock()
	if s.rec != nil {
		s.rec.addEvent(name, at, attrs)
	}
	s.mu.Unlock()
}

// cloneAttrs copies attrs for the SDK, so that the callers' slices stay on
// their stacks (the interface call would let them escape).
func cloneAttrs(attrs []attribute.KeyValue) []attribute.KeyValue {
	if len(attrs) == 0 {
		return nil
	}
	return append([]attribute.KeyValue(nil), attrs...)
}

// AddLink adds a link to another span.
func (s *Span) AddLink(l trace.Link) {
	if s.sdk != nil {
		s.sdk.AddLink(l)
		return
	}
	if !l.SpanContext.IsValid() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rec == nil {
		return
	}
	if len(s.rec.links) >= linkLimit {
		s.rec.droppedLinks++
		return
	}
	attrs, dropped := setAttrsCopy(l.Attributes)
	s.rec.links = append(s.rec.links, sdktrace.Link{SpanContext: l.SpanContext, Attributes: attrs, DroppedAttributeCount: dropped})
}

// setAttrsCopy is a link's attributes as the SDK keeps them (its
// evictedQueue keeps them all, invalid ones too, up to the limit).
func setAttrsCopy(attrs []attribute.KeyValue) ([]attribute.KeyValue, int) {
	if len(attrs) > attrLimit {
		return append([]attribute.KeyValue(nil), attrs[:attrLimit]...), len(attrs) - attrLimit
	}
	return append([]attribute.KeyValue(nil), attrs...), 0
}

// RecordError adds an exception event for err, as the SDK's span does.
func (s *Span) RecordError(err error, options ...trace.EventOption) {
	if s.sdk != nil {
		s.sdk.RecordError(err, options...)
		return
	}
	if err == nil || !s.IsRecording() {
		return
	}
	c := trace.NewEventConfig(options...)
	attrs := append(c.Attributes(), attribute.String("exception.type", errorType(err)), attribute.String("exception.message", err.Error()))
	s.AddEventAt("exception", c.Timestamp(), attrs...)
}

// errorType is the SDK's typeStr: the package path and name of err's type.
func errorType(err error) string {
	t := reflect.TypeOf(err)
	if t.PkgPath() == "" && t.Name() == "" {
		return t.String() // a pointer or another unnamed type
	}
	return t.PkgPath() + "." + t.Name()
}

// SetStatus sets the status as the SDK's span does: a code below the one
// set is ignored, the description kept only for an error.
func (s *Span) SetStatus(code codes.Code, description string) {
	if s.sdk != nil {
		s.sdk.SetStatus(code, description)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rec == nil || s.rec.status.Code > code {
		return
	}
	st := sdktrace.Status{Code: code}
	if code == codes.Error {
		st.Description = description
	}
	s.rec.status = st
}

// SetName renames the span.
func (s *Span) SetName(name string) {
	if s.sdk != nil {
		s.sdk.SetName(name)
		return
	}
	s.mu.Lock()
	if s.rec != nil {
		s.rec.name = name
	}
	s.mu.Unlock()
}

// SetAttributes sets attributes (replacing those of the same keys).
func (s *Span) SetAttributes(kv ...attribute.KeyValue) { s.SetAttrs(kv) }

// SetAttrs is SetAttributes; attrs does not escape.
func (s *Span) SetAttrs(attrs []attribute.KeyValue) {
	if len(attrs) == 0 {
		return
	}
	if s.sdk != nil {
		s.sdk.SetAttributes(cloneAttrs(attrs)...)
		return
	}
	s.mu.Lock()
	if s.rec != nil {
		s.rec.setAttrs(attrs)
	}
	s.mu.Unlock()
}

// TracerProvider returns a no-op provider: Sluice's spans are made by its
// Tracer only.
func (s *Span) TracerProvider() trace.TracerProvider {
	if s.sdk != nil {
		return s.sdk.TracerProvider()
	}
	return noop.NewTracerProvider()
}
