package tracing

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/encoding/protowire"
)

// wireExporter is an OTLP/HTTP (http/protobuf) span exporter that encodes
// the SDK's ReadOnlySpans straight to the protobuf wire format of an
// ExportTraceServiceRequest in a reused buffer, instead of building the
// generated protobuf structs (otlptracehttp's transform makes 3-4
// allocations per attribute, then marshals them). The bytes are those
// otlptracehttp v1.47.0 sends for the same spans (field for field as its
// internal/tracetransform/span.go, attribute.go, resource.go and
// instrumentation.go build them; TestWireExporterMatchesSDK decodes both
// and compares), posted the same way: POST to the traces URL,
// Content-Type application/x-protobuf, a 2xx answer is success, 429, 502,
// 503 and 504 are retried (honouring Retry-After) until the export's
// context ends. The batch span processor calls ExportSpans from its one
// goroutine; mu guards the buffer all the same.
type wireExporter struct {
	url     string
	headers map[string]string
	client  *http.Client

	mu  sync.Mutex
	buf []byte
	res []byte // the encoded Resource message of the last resource seen
	rp  *resource.Resource

	direct atomic.Uint64 // body bytes written by exportConn.ReadFrom from the buffer itself
}

// unsupportedHTTPEnv are the OTEL_* variables the wire exporter does not
// implement; when one is set New falls back to otlptracehttp.
var unsupportedHTTPEnv = []string{
	"OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
	"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
	"OTEL_EXPORTER_OTLP_CLIENT_KEY", "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
	"OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
	"OTEL_EXPORTER_OTLP_INSECURE", "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
}

// newWireExporter returns the wire exporter for c, or nil when c (or the
// environment) asks for something only otlptracehttp does: no endpoint
// URL given (the SDK's default endpoint and its https/insecure rules), or
// one of unsupportedHTTPEnv set.
func newWireExporter(c Config) *wireExporter {
	for _, k := range unsupportedHTTPEnv {
		if os.Getenv(k) != "" {
			return nil
		}
	}
	var target string
	switch {
	case c.Endpoint != "":
		target = c.Endpoint
		if u, err := url.Parse(c.Endpoint); err == nil && (u.Path == "" || u.Path == "/") {
			target = strings.TrimSuffix(c.Endpoint, "/") + "/v1/traces"
		}
	case os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "":
		target = os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") // used as is
	case os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "":
		target = strings.TrimSuffix(os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT"), "/") + "/v1/traces"
	default:
		return nil
	}
	if u, err := url.Parse(target); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil
	}
	headers := c.Headers
	if len(headers) == 0 {
		headers = envHeaders("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
		if headers == nil {
			headers = envHeaders("OTEL_EXPORTER_OTLP_HEADERS")
		}
	}
	timeout := 10 * time.Second // the SDK's default export timeout
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"} {
		var ms int
		if _, err := fmt.Sscan(os.Getenv(k), &ms); err == nil && ms > 0 {
			timeout = time.Duration(ms) * time.Millisecond
			break
		}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	e := &wireExporter{url: target, headers: headers, client: &http.Client{Transport: tr, Timeout: timeout}}
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return exportConn{c, e}, nil // TLS, when the URL is https, wraps it in turn
	}
	return e
}

// exportConn is a connection of the exporter's transport. net/http copies
// a request body of known length to the connection through an
// io.LimitedReader, which hides the body's WriterTo, and reaches the
// connection's ReadFrom (through its connection writer, once the head is
// flushed); net.TCPConn's ReadFrom then falls back to io.Copy, which
// makes a new 32 KiB buffer for every export and writes 32 KiB at a time.
// exportConn's ReadFrom writes a wireBody's bytes from the exporter's
// buffer in one Write instead: no buffer made, one write per export.
type exportConn struct {
	net.Conn
	e *wireExporter
}

func (c exportConn) ReadFrom(r io.Reader) (int64, error) {
	if lr, ok := r.(*io.LimitedReader); ok {
		if b, ok := lr.R.(*wireBody); ok {
			p := b.next(lr.N)
			n, err := c.Conn.Write(p)
			b.Seek(int64(n), io.SeekCurrent)
			lr.N -= int64(n)
			c.e.direct.Add(uint64(n))
			return int64(n), err // all of it (the limit or the body's end) unless err
		}
	}
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

// envHeaders parses an OTEL_EXPORTER_OTLP_HEADERS value: key=value pairs
// separated by commas, URL-encoded values; nil when unset.
func envHeaders(k string) map[string]string {
	v := os.Getenv(k)
	if v == "" {
		return nil
	}
	h := map[string]string{}
	for _, kv := range strings.Split(v, ",") {
		name, val, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		name = strings.TrimSpace(name)
		if dv, err := url.PathUnescape(strings.TrimSpace(val)); err == nil && name != "" {
			h[name] = dv
		}
	}
	return h
}

// ExportSpans encodes spans and posts them.
func (e *wireExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if len(spans) == 0 {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.buf = e.encode(e.buf[:0], spans)
	return e.post(ctx, e.buf)
}

// wireBody is a request body over the exporter's buffer. The transport may
// still read a body after Do returns (a collector answering before it read
// everything); post then gives the buffer up instead of reusing it.
type wireBody struct {
	bytes.Reader
	b      []byte // what Reader reads
	closed atomic.Bool
}

func (b *wireBody) Close() error { b.closed.Store(true); return nil }

// next is the body's unread bytes, at most n.
func (b *wireBody) next(n int64) []byte {
	off := len(b.b) - b.Len()
	return b.b[off : off+int(min(n, int64(b.Len())))]
}

func (e *wireExporter) post(ctx context.Context, body []byte) error {
	for attempt := 0; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, nil)
		if err != nil {
			return err
		}
		var bodies []*wireBody
		req.GetBody = func() (io.ReadCloser, error) { // also for the transport's retry on a stale connection
			b := &wireBody{b: body}
			b.Reset(body)
			bodies = append(bodies, b)
			return b, nil
		}
		req.Body, _ = req.GetBody()
		req.ContentLength = int64(len(body))
		req.Header.Set("Content-Type", "application/x-protobuf")
		req.Header.Set("User-Agent", "sluice OTLP/HTTP exporter")
		for k, v := range e.headers {
			req.Header.Set(k, v)
		}
		resp, err := e.client.Do(req)
		if err == nil {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // keep the connection reusable; partial success is not read
			resp.Body.Close()
		}
		for _, b := range bodies {
			if !b.closed.Load() {
				e.buf, body = nil, slices.Clone(body) // still read: neither reuse nor change it
				break
			}
		}
		if err != nil {
			return fmt.Errorf("otlp/http export: %w", err)
		}
		switch sc := resp.StatusCode; {
		case sc >= 200 && sc < 300:
			return nil
		case sc == 429 || sc == 502 || sc == 503 || sc == 504:
			wait := time.Duration(100<<min(attempt, 6)) * time.Millisecond
			var secs int
			if _, err := fmt.Sscan(resp.Header.Get("Retry-After"), &secs); err == nil && secs > 0 {
				wait = time.Duration(secs) * time.Second
			}
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return fmt.Errorf("otlp/http export: %s, retry: %w", resp.Status, ctx.Err())
			case <-t.C:
			}
		default:
			return fmt.Errorf("otlp/http export: %s", resp.Status)
		}
	}
}

// Shutdown closes the idle connections.
func (e *wireExporter) Shutdown(ctx context.Context) error {
	e.client.CloseIdleConnections()
	return ctx.Err()
}

// Field numbers of opentelemetry/proto (v1.11.0): collector/trace/v1,
// trace/v1, resource/v1, common/v1.
const (
	fReqResourceSpans = 1 // ExportTraceServiceRequest.resource_spans

	fRSResource   = 1 // ResourceSpans.resource
	fRSScopeSpans = 2
	fRSSchemaURL  = 3

	fResAttributes = 1 // Resource.attributes

	fSSScope     = 1 // ScopeSpans.scope
	fSSSpans     = 2
	fSSSchemaURL = 3

	fScopeName    = 1 // InstrumentationScope
	fScopeVersion = 2
	fScopeAttrs   = 3

	fSpanTraceID      = 1
	fSpanSpanID       = 2
	fSpanTraceState   = 3
	fSpanParentSpanID = 4
	fSpanName         = 5
	fSpanKind         = 6
	fSpanStart        = 7
	fSpanEnd          = 8
	fSpanAttrs        = 9
	fSpanDroppedAttrs = 10
	fSpanEvents       = 11
	fSpanDroppedEv    = 12
	fSpanLinks        = 13
	fSpanDroppedLinks = 14
	fSpanStatus       = 15
	fSpanFlags        = 16

	fEventTime    = 1
	fEventName    = 2
	fEventAttrs   = 3
	fEventDropped = 4

	fLinkTraceID    = 1
	fLinkSpanID     = 2
	fLinkTraceState = 3
	fLinkAttrs      = 4
	fLinkDropped    = 5
	fLinkFlags      = 6

	fStatusMessage = 2
	fStatusCode    = 3

	fKVKey   = 1
	fKVValue = 2

	fAnyString = 1
	fAnyBool   = 2
	fAnyInt    = 3
	fAnyDouble = 4
	fAnyArray  = 5
	fAnyKVList = 6
	fAnyBytes  = 7

	fArrayValues = 1 // ArrayValue.values, KeyValueList.values

	flagHasIsRemote = 0x100 // SpanFlags_SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
	flagIsRemote    = 0x200 // SpanFlags_SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
)

// open starts a length-delimited field: its tag and one byte reserved for
// the length; close writes the length there (moving the body when the
// length needs more bytes).
func open(b []byte, field protowire.Number) ([]byte, int) {
	b = putTag(b, field, protowire.BytesType)
	return append(b, 0), len(b)
}

func closeAt(b []byte, at int) []byte {
	n := len(b) - at - 1
	if n < 0x80 {
		b[at] = byte(n)
		return b
	}
	sz := protowire.SizeVarint(uint64(n))
	b = append(b, make([]byte, sz-1)...)
	copy(b[at+sz:], b[at+1:at+1+n])
	putVarint(b[at:at], uint64(n))
	return b
}

// putTag, putVarint, putString and putBytes are protowire's Append
// functions with a fast path for values under 0x80 (a field's tag, most
// lengths): protowire.AppendVarint is not inlined, and the encoder calls
// it several times per attribute.
func putTag(b []byte, num protowire.Number, typ protowire.Type) []byte {
	if num >= 0 && num < 16 { // one byte: protowire.EncodeTag's value
		return append(b, byte(num)<<3|byte(typ&7))
	}
	return protowire.AppendTag(b, num, typ)
}

func putVarint(b []byte, v uint64) []byte {
	if v < 0x80 {
		return append(b, byte(v))
	}
	return protowire.AppendVarint(b, v)
}

func putString(b []byte, s string) []byte {
	return append(putVarint(b, uint64(len(s))), s...)
}

func putBytes(b []byte, v []byte) []byte {
	return append(putVarint(b, uint64(len(v))), v...)
}

func appendString(b []byte, field protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = putTag(b, field, protowire.BytesType)
	return putString(b, s)
}

func appendBytes(b []byte, field protowire.Number, v []byte) []byte {
	b = putTag(b, field, protowire.BytesType)
	return putBytes(b, v)
}

func appendVarint(b []byte, field protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = putTag(b, field, protowire.VarintType)
	return putVarint(b, v)
}

func appendFixed64(b []byte, field protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = putTag(b, field, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, v)
}

func unixNano(t time.Time) uint64 { return uint64(max(0, t.UnixNano())) }

func clampCount(v int) uint64 { return uint64(min(max(v, 0), math.MaxUint32)) }

// encode appends the ExportTraceServiceRequest of spans to b: one
// ResourceSpans per resource, one ScopeSpans per scope in it, in the
// order they first appear (Sluice has one of each, the common case done
// in one pass; the SDK's transform groups the same way, through maps).
func (e *wireExporter) encode(b []byte, spans []sdktrace.ReadOnlySpan) []byte {
	var seen []bool // nil while no span was encoded out of order
	for i, s := range spans {
		if s == nil || seen != nil && seen[i] {
			continue
		}
		res := s.Resource()
		var at int
		b, at = open(b, fReqResourceSpans)
		b = e.appendResource(b, res)
		for j := i; j < len(spans); j++ { // the scopes of res
			sj := spans[j]
			if sj == nil || seen != nil && seen[j] || !sameResource(sj.Resource(), res) {
				continue
			}
			scope := sj.InstrumentationScope()
			var sat int
			b, sat = open(b, fRSScopeSpans)
			b = appendScope(b, scope)
			for k := j; k < len(spans); k++ { // the spans of res and scope
				sk := spans[k]
				if sk == nil || seen != nil && seen[k] {
					continue
				}
				if k > j && (!sameResource(sk.Resource(), res) || sk.InstrumentationScope() != scope) {
					continue
				}
				var pat int
				b, pat = open(b, fSSSpans)
				b = appendSpan(b, sk)
				b = closeAt(b, pat)
				if k > i {
					if seen == nil {
						seen = make([]bool, len(spans))
					}
					seen[k] = true
				}
			}
			b = appendString(b, fSSSchemaURL, scope.SchemaURL)
			b = closeAt(b, sat)
		}
		b = appendString(b, fRSSchemaURL, schemaURL(res))
		b = closeAt(b, at)
	}
	return b
}

func sameResource(a, b *resource.Resource) bool {
	return a == b || a.Equivalent() == b.Equivalent()
}

func schemaURL(r *resource.Resource) string {
	if r == nil {
		return ""
	}
	return r.SchemaURL()
}

// appendResource appends the resource field, encoded once per resource.
func (e *wireExporter) appendResource(b []byte, r *resource.Resource) []byte {
	if r == nil {
		return b
	}
	if r != e.rp || e.res == nil {
		res, at := open(e.res[:0], fRSResource)
		for it := r.Iter(); it.Next(); {
			res = appendKV(res, fResAttributes, it.Attribute())
		}
		e.res, e.rp = closeAt(res, at), r
	}
	return append(b, e.res...)
}

func appendScope(b []byte, s instrumentation.Scope) []byte {
	if s == (instrumentation.Scope{}) {
		return b
	}
	b, at := open(b, fSSScope)
	b = appendString(b, fScopeName, s.Name)
	b = appendString(b, fScopeVersion, s.Version)
	for it := s.Attributes.Iter(); it.Next(); {
		b = appendKV(b, fScopeAttrs, it.Attribute())
	}
	return closeAt(b, at)
}

// spanData is what appendSpan reads of a span: the methods of
// sdktrace.ReadOnlySpan that the SDK's transform reads, which the lean
// recorder's records have too.
type spanData interface {
	SpanContext() trace.SpanContext
	Parent() trace.SpanContext
	Name() string
	SpanKind() trace.SpanKind
	StartTime() time.Time
	EndTime() time.Time
	Attributes() []attribute.KeyValue
	DroppedAttributes() int
	Events() []sdktrace.Event
	DroppedEvents() int
	Links() []sdktrace.Link
	DroppedLinks() int
	Status() sdktrace.Status
}

// exportEncoded posts spans, Span messages the lean recorder encoded (each
// a ScopeSpans.spans field), all of the resource res and the scope scope.
func (e *wireExporter) exportEncoded(ctx context.Context, spans []byte, res *resource.Resource, scope instrumentation.Scope) error {
	if len(spans) == 0 {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	b, at := open(e.buf[:0], fReqResourceSpans)
	b = e.appendResource(b, res)
	var sat int
	b, sat = open(b, fRSScopeSpans)
	b = appendScope(b, scope)
	b = append(b, spans...)
	b = appendString(b, fSSSchemaURL, scope.SchemaURL)
	b = closeAt(b, sat)
	b = appendString(b, fRSSchemaURL, schemaURL(res))
	e.buf = closeAt(b, at)
	return e.post(ctx, e.buf)
}

func appendSpan(b []byte, s spanData) []byte {
	sc := s.SpanContext()
	tid, sid := sc.TraceID(), sc.SpanID()
	b = appendBytes(b, fSpanTraceID, tid[:])
	b = appendBytes(b, fSpanSpanID, sid[:])
	if r, ok := s.(*record); ok { // the lean recorder's: the tracestate as received
		if r.ts != "" {
			b = appendString(b, fSpanTraceState, r.ts)
		}
	} else if ts := sc.TraceState(); ts.Len() > 0 {
		b = appendString(b, fSpanTraceState, ts.String())
	}
	parent := s.Parent()
	if psid := parent.SpanID(); psid.IsValid() {
		b = appendBytes(b, fSpanParentSpanID, psid[:])
	}
	b = appendString(b, fSpanName, s.Name())
	b = appendVarint(b, fSpanKind, uint64(spanKind(s.SpanKind())))
	b = appendFixed64(b, fSpanStart, unixNano(s.StartTime()))
	b = appendFixed64(b, fSpanEnd, unixNano(s.EndTime()))
	for _, kv := range s.Attributes() {
		b = appendKV(b, fSpanAttrs, kv)
	}
	b = appendVarint(b, fSpanDroppedAttrs, clampCount(s.DroppedAttributes()))
	for _, ev := range s.Events() {
		var at int
		b, at = open(b, fSpanEvents)
		b = appendFixed64(b, fEventTime, unixNano(ev.Time))
		b = appendString(b, fEventName, ev.Name)
		for _, kv := range ev.Attributes {
			b = appendKV(b, fEventAttrs, kv)
		}
		b = appendVarint(b, fEventDropped, clampCount(ev.DroppedAttributeCount))
		b = closeAt(b, at)
	}
	b = appendVarint(b, fSpanDroppedEv, clampCount(s.DroppedEvents()))
	for _, l := range s.Links() {
		var at int
		b, at = open(b, fSpanLinks)
		ltid, lsid := l.SpanContext.TraceID(), l.SpanContext.SpanID()
		b = appendBytes(b, fLinkTraceID, ltid[:])
		b = appendBytes(b, fLinkSpanID, lsid[:])
		_ = fLinkTraceState // the SDK's transform does not send a link's tracestate
		for _, kv := range l.Attributes {
			b = appendKV(b, fLinkAttrs, kv)
		}
		b = appendVarint(b, fLinkDropped, clampCount(l.DroppedAttributeCount))
		b = putTag(b, fLinkFlags, protowire.Fixed32Type)
		b = protowire.AppendFixed32(b, spanFlags(l.SpanContext.TraceFlags(), l.SpanContext))
		b = closeAt(b, at)
	}
	b = appendVarint(b, fSpanDroppedLinks, clampCount(s.DroppedLinks()))
	st := s.Status()
	var at int
	b, at = open(b, fSpanStatus) // always present, as the SDK's transform sends it
	b = appendString(b, fStatusMessage, st.Description)
	b = appendVarint(b, fStatusCode, statusCode(st.Code))
	b = closeAt(b, at)
	b = putTag(b, fSpanFlags, protowire.Fixed32Type)
	return protowire.AppendFixed32(b, spanFlags(sc.TraceFlags(), parent))
}

func spanFlags(tf trace.TraceFlags, parent trace.SpanContext) uint32 {
	f := uint32(tf) | flagHasIsRemote
	if parent.IsRemote() {
		f |= flagIsRemote
	}
	return f
}

// spanKind maps to Span.SpanKind (the numbers differ only for unknown
// kinds, sent as unspecified).
func spanKind(k trace.SpanKind) uint64 {
	switch k {
	case trace.SpanKindInternal, trace.SpanKindServer, trace.SpanKindClient, trace.SpanKindProducer, trace.SpanKindConsumer:
		return uint64(k)
	}
	return 0
}

// statusCode maps to Status.StatusCode (OK is 1 and ERROR 2 there).
func statusCode(c codes.Code) uint64 {
	switch c {
	case codes.Ok:
		return 1
	case codes.Error:
		return 2
	}
	return 0
}

func appendKV(b []byte, field protowire.Number, kv attribute.KeyValue) []byte {
	b, at := open(b, field)
	b = appendString(b, fKVKey, string(kv.Key))
	b = appendValue(b, fKVValue, kv.Value)
	return closeAt(b, at)
}

// appendValue appends v as an AnyValue message in field, as
// tracetransform.Value builds it.
func appendValue(b []byte, field protowire.Number, v attribute.Value) []byte {
	b, at := open(b, field)
	switch v.Type() {
	case attribute.BOOL:
		b = putTag(b, fAnyBool, protowire.VarintType)
		b = putVarint(b, protowire.EncodeBool(v.AsBool()))
	case attribute.INT64:
		b = putTag(b, fAnyInt, protowire.VarintType)
		b = putVarint(b, uint64(v.AsInt64()))
	case attribute.FLOAT64:
		b = putTag(b, fAnyDouble, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, math.Float64bits(v.AsFloat64()))
	case attribute.STRING:
		b = putTag(b, fAnyString, protowire.BytesType)
		b = putString(b, v.AsString())
	case attribute.BYTESLICE:
		b = appendBytes(b, fAnyBytes, v.AsByteSlice())
	case attribute.BOOLSLICE:
		b = appendArray(b, v.AsBoolSlice(), attribute.BoolValue)
	case attribute.INT64SLICE:
		b = appendArray(b, v.AsInt64Slice(), attribute.Int64Value)
	case attribute.FLOAT64SLICE:
		b = appendArray(b, v.AsFloat64Slice(), attribute.Float64Value)
	case attribute.STRINGSLICE:
		b = appendStringSlice(b, v)
	case attribute.SLICE:
		b = appendArray(b, v.AsSlice(), func(x attribute.Value) attribute.Value { return x })
	case attribute.MAP:
		var aat int
		b, aat = open(b, fAnyKVList)
		for _, kv := range v.AsMap() {
			b = appendKV(b, fArrayValues, kv)
		}
		b = closeAt(b, aat)
	case attribute.EMPTY:
	default:
		b = putTag(b, fAnyString, protowire.BytesType)
		b = putString(b, "INVALID")
	}
	return closeAt(b, at)
}

var _ sdktrace.SpanExporter = (*wireExporter)(nil)

// appendArray appends xs as an ArrayValue (AnyValue.array_value), each
// element as the attribute value wrap makes of it.
func appendArray[T any](b []byte, xs []T, wrap func(T) attribute.Value) []byte {
	b, at := open(b, fAnyArray)
	for _, x := range xs {
		b = appendValue(b, fArrayValues, wrap(x))
	}
	return closeAt(b, at)
}

// stringSlices are the encoded ArrayValues of string-slice attribute
// values seen (gen_ai.response.finish_reasons has a few distinct values:
// ["stop"], ["length"]…): v.AsStringSlice copies the slice, an
// allocation per span. A map replaced whole when a value is added
// (readers take no lock), bounded to maxStringSlices small values.
var stringSlices atomic.Pointer[map[attribute.Value][]byte]

const (
	maxStringSlices   = 64  // values kept
	maxStringSliceLen = 128 // encoded bytes of a value kept
)

var stringSlicesMu sync.Mutex // serializes adding to stringSlices

// appendStringSlice appends v, a STRINGSLICE, as appendArray does.
func appendStringSlice(b []byte, v attribute.Value) []byte {
	m := stringSlices.Load()
	if m != nil {
		if enc, ok := (*m)[v]; ok {
			return append(b, enc...)
		}
	}
	start := len(b)
	b = appendArray(b, v.AsStringSlice(), attribute.StringValue)
	if enc := b[start:]; len(enc) <= maxStringSliceLen && (m == nil || len(*m) < maxStringSlices) {
		stringSlicesMu.Lock()
		old := stringSlices.Load()
		if old == nil || len(*old) < maxStringSlices {
			next := make(map[attribute.Value][]byte, 1+len(mapOrNil(old)))
			for k, e := range mapOrNil(old) {
				next[k] = e
			}
			next[v] = slices.Clone(enc)
			stringSlices.Store(&next)
		}
		stringSlicesMu.Unlock()
	}
	return b
}

func mapOrNil(m *map[attribute.Value][]byte) map[attribute.Value][]byte {
	if m == nil {
		return nil
	}
	return *m
}
