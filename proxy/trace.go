package proxy

import (
	"bytes"
	"encoding/hex"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-proxy/sluice/proxy/observe"
	"github.com/sluice-proxy/sluice/proxy/tracing"
)

// Attribute names. The gen_ai.* and HTTP names are those of the
// OpenTelemetry semantic conventions v1.40.0 (GenAI spans, as renamed in
// v1.37: gen_ai.usage.input_tokens / output_tokens,
// gen_ai.response.finish_reasons; see semconv/v1.40.0 in
// go.opentelemetry.io/otel v1.47.0); sluice.* are Sluice's own.
const (
	attrGenAIOperation    = attribute.Key("gen_ai.operation.name")
	attrGenAIModel        = attribute.Key("gen_ai.request.model")
	attrGenAIMaxTokens    = attribute.Key("gen_ai.request.max_tokens")
	attrGenAIChoiceCount  = attribute.Key("gen_ai.request.choice.count")
	attrGenAIInputTokens  = attribute.Key("gen_ai.usage.input_tokens")
	attrGenAIOutputTokens = attribute.Key("gen_ai.usage.output_tokens")
	attrGenAIFinish       = attribute.Key("gen_ai.response.finish_reasons")
	attrHTTPMethod        = attribute.Key("http.request.method")
	attrHTTPStatus        = attribute.Key("http.response.status_code")
	attrURLPath           = attribute.Key("url.path")
	attrClientAddress     = attribute.Key("client.address")
	attrServerAddress     = attribute.Key("server.address")
	attrServerPort        = attribute.Key("server.port")
	attrProtocol          = attribute.Key("network.protocol.name")
	attrErrorType         = attribute.Key("error.type")
	attrTenant            = attribute.Key("sluice.tenant.id")
	attrRequestID         = attribute.Key("sluice.request.id")
	attrRoute             = attribute.Key("sluice.route")
	attrPool              = attribute.Key("sluice.pool")
	attrAttempt           = attribute.Key("sluice.attempt")
	attrHedge             = attribute.Key("sluice.hedge")
	attrResult            = attribute.Key("sluice.attempt.result")
	attrRetries           = attribute.Key("sluice.retries")
	attrHedged            = attribute.Key("sluice.hedged")
	attrServerTiming      = attribute.Key("sluice.server_timing")
)

// reqTrace is a traced request's spans; the exchange holds one only when
// tracing is on. The spans and the strings the trace needs are in it
// (sluice.server_timing is the exchange's Server-Timing header value).
//
// It comes from a free list (reqTraces) and goes back when its last
// holder lets go (refs): the exchange, from startTrace to the end of
// complete, and each attempt's leg whose span is in it, from startSpan to
// endSpan (a hedge's losing leg ends on its own goroutine). Nothing else
// keeps a pointer into it past those points:
//   - its strings over its own bytes (id over hex) are read only by the
//     exchange's access log and the attempts' failure logs, each before
//     its holder lets go (the logs copy them); a leg's failure log runs
//     before the leg closes, and the exchange waits for every leg of a
//     race (drainRace) before it completes;
//   - the upstream request's traceparent header is not in it: the first
//     attempt's is in the exchange (exchange.tp, never reused), a retry's
//     or a hedge's in a Traceparent of its own, because a transport may
//     read a request's header after RoundTrip returned;
//   - the spans' records go to the export queue at End, which keeps only
//     their encoding.
type reqTrace struct {
	span      tracing.Span    // the request's SERVER span
	legs      [1]tracing.Span // the first attempt's CLIENT span (a retry's or a hedge's is allocated)
	nlegs     int             // legs used
	refs      atomic.Int32    // holders: the exchange and the legs whose span is in legs
	rec       bool            // span is recording (sampled)
	id        string          // the trace id, for the access log
	finish    []string        // finish reasons seen, in order, without repeats
	finishBuf [2]string
	hex       [32]byte // id's bytes, unless id is a substring of the client's traceparent
}

// reqTraces is the free list of reqTrace.
var reqTraces = sync.Pool{New: func() any { return new(reqTrace) }}

// release lets go of one hold on tr; the last puts it back on the free
// list, cleared (so that it keeps no strings alive).
func (tr *reqTrace) release() {
	if tr.refs.Add(-1) != 0 {
		return
	}
	*tr = reqTrace{}
	reqTraces.Put(tr)
}

// startTrace starts the request's server span when tracing is on.
func (x *exchange) startTrace() {
	t := x.h.tracer
	if t == nil {
		return
	}
	tr := reqTraces.Get().(*reqTrace)
	tr.refs.Store(1) // the exchange's, let go by releaseTrace
	t.StartRequest(&tr.span, x.r.Header, x.r.Method, x.start)
	tr.rec = tr.span.IsRecording()
	tr.finish = tr.finishBuf[:0]
	id := tr.span.TraceID()
	if client := tracing.TraceIDOf(x.r.Header.Get("Traceparent")); client != "" && hexIs(client, id[:]) {
		tr.id = client // the client's trace continued: its header has the id
	} else {
		hex.Encode(tr.hex[:], id[:])
		tr.id = unsafe.String(&tr.hex[0], len(tr.hex))
	}
	x.trace = tr
}

// releaseTrace lets go of the exchange's hold on its trace, once it has
// ended and been logged (the end of complete): after it x.trace is nil.
func (x *exchange) releaseTrace() {
	if tr := x.trace; tr != nil {
		x.trace = nil
		tr.release()
	}
}

// traceID is the request's trace id for the access log: the server span's
// when tracing is on, else the client's traceparent's (which the backend
// receives unchanged), else "".
func (x *exchange) traceID() string {
	if x.trace != nil {
		return x.trace.id
	}
	return tracing.TraceIDOf(x.r.Header.Get("Traceparent"))
}

// hexIs reports whether h (lower-case hex) spells b.
func hexIs(h string, b []byte) bool {
	const digits = "0123456789abcdef"
	if len(h) != 2*len(b) {
		return false
	}
	for i, c := range b {
		if h[2*i] != digits[c>>4] || h[2*i+1] != digits[c&15] {
			return false
		}
	}
	return true
}

// spanNames are the server spans' names ("POST main") by method and
// route, made once each (a request's name would otherwise be a new
// string). Bounded: POST and GET only, times the route names configured
// since the start (a reload's old names stay).
var spanNames sync.Map // spanName -> string

type spanName struct{ method, route string }

func serverSpanName(method, route string) string {
	if method != "POST" && method != "GET" { // a client picks the method: only these are kept
		return method + " " + route
	}
	k := spanName{method, route}
	if v, ok := spanNames.Load(k); ok {
		return v.(string)
	}
	v, _ := spanNames.LoadOrStore(k, method+" "+route)
	return v.(string)
}

// endTrace records the stages (child spans or events, see
// tracing.Config.StageSpans) from the exchange's timing marks, sets the
// request's attributes and ends the server span at end.
func (x *exchange) endTrace(end time.Time) {
	tr := x.trace
	if tr == nil {
		return
	}
	t, s := x.h.tracer, &tr.span
	if !tr.rec {
		s.EndAt(end)
		return
	}
	tr.rec = false // once: a second call only ends the ended span
	if t.StagesRecorded() {
		var buf [8]tracing.Mark
		marks := buf[:0]
		stage := func(name string, a, b time.Time, attrs ...attribute.KeyValue) {
			if !a.IsZero() && !b.IsZero() {
				if b.Before(a) {
					b = a
				}
				marks = append(marks, tracing.Mark{Name: name, Start: a, End: b, Attrs: attrs})
			}
		}
		stage(observe.StageAuth, x.start, x.authDone)
		stage(observe.StageRecv, x.authDone, x.bodyRead)
		stage(observe.StageRoute, x.bodyRead, x.routed)
		stage(observe.StageLimit, x.routed, x.limited)
		if _, ok := x.stage(observe.StageQueue); ok && !x.admitted.IsZero() {
			stage(observe.StageQueue, x.admitted.Add(-x.queueWait), x.admitted)
		}
		stage(observe.StagePrefill, x.upstreamHeaders, x.firstToken)
		if !x.firstToken.IsZero() && !x.lastToken.IsZero() {
			stage(observe.StageDecode, x.firstToken, x.lastToken, attrGenAIOutputTokens.Int64(x.outputTokens()))
		}
		t.StagesOf(s, marks)
	}

	status := x.status
	if status == 0 {
		status = 499
	}
	// Each attribute is stored and encoded with every trace: the set is
	// kept to what a trace is read for (the backend and pool are on the
	// attempt spans).
	var buf [20]attribute.KeyValue // on the stack: SetAttrs copies them
	attrs := append(buf[:0], attrHTTPMethod.String(x.r.Method), attrHTTPStatus.Int(status),
		attrProtocol.String(protoOf(x.r, x.conn)), attrClientAddress.String(clientIP(x.r)), attrRequestID.String(x.id))
	if x.tenant != nil {
		attrs = append(attrs, attrTenant.String(x.tenant.ID))
	}
	var timing [256]byte
	if b := x.appendServerTiming(timing[:0]); len(b) > 0 { // the stages' durations, as the Server-Timing header has them
		v := x.timing // the header's: the same text, no string to make (the common case)
		if string(b) != v {
			v = string(b)
		}
		attrs = append(attrs, attrServerTiming.String(v))
	}
	name := x.r.Method
	if x.route != nil {
		attrs = append(attrs, attrRoute.String(x.route.Name))
		name = serverSpanName(x.r.Method, x.route.Name)
	} else {
		attrs = append(attrs, attrURLPath.String(x.r.URL.Path))
	}
	if x.parsed {
		attrs = append(attrs, attrGenAIOperation.String(x.operation()), attrGenAIModel.String(x.meta.Model))
		if x.meta.OutputTokens > 0 {
			attrs = append(attrs, attrGenAIMaxTokens.Int64(x.meta.OutputTokens))
		}
		if x.meta.N > 1 {
			attrs = append(attrs, attrGenAIChoiceCount.Int64(x.meta.N))
		}
		if u := x.consumed(); x.usage != nil || x.tokens > 0 {
			attrs = append(attrs, attrGenAIInputTokens.Int64(u.InputTokens), attrGenAIOutputTokens.Int64(u.OutputTokens))
		}
	}
	if len(tr.finish) > 0 {
		attrs = append(attrs, finishAttr(tr.finish))
	}
	if x.retries > 0 {
		attrs = append(attrs, attrRetries.Int(x.retries))
	}
	if x.hedged {
		attrs = append(attrs, attrHedged.Bool(true))
	}
	if x.err != nil {
		class := errorClass(x)
		attrs = append(attrs, attrErrorType.String(class))
		if status >= 500 || status == 499 {
			s.SetStatus(codes.Error, x.err.Error())
		}
	}
	s.SetName(name)
	s.SetAttrs(attrs)
	s.EndAt(end)
}

// operation is the request's gen_ai.operation.name.
func (x *exchange) operation() string {
	switch {
	case strings.HasSuffix(strings.TrimSuffix(x.r.URL.Path, "/"), "/embeddings"):
		return "embeddings"
	case x.dialect == dialectCompletions:
		return "text_completion"
	}
	return "chat"
}

var finishKeys = [][]byte{[]byte(`"finish_reason"`), []byte(`"stop_reason"`)}

// finishReasons are the finish reasons of OpenAI's and Anthropic's APIs,
// interned, and the attribute of each alone, made once: the common case
// costs no string and no attribute slice.
var finishReasons = func() map[string]finishKnown {
	m := map[string]finishKnown{}
	for _, r := range []string{"stop", "length", "tool_calls", "content_filter", "function_call", // OpenAI
		"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal"} { // Anthropic
		m[r] = finishKnown{r, attrGenAIFinish.StringSlice([]string{r})}
	}
	return m
}()

type finishKnown struct {
	reason string
	attr   attribute.KeyValue // the reason alone
}

// finishReason is v as a string, interned when it is a known reason.
func finishReason(v []byte) string {
	if k, ok := finishReasons[string(v)]; ok { // the lookup does not allocate
		return k.reason
	}
	return string(v)
}

// finishAttr is gen_ai.response.finish_reasons for reasons.
func finishAttr(reasons []string) attribute.KeyValue {
	if len(reasons) == 1 {
		if k, ok := finishReasons[reasons[0]]; ok {
			return k.attr
		}
	}
	return attrGenAIFinish.StringSlice(reasons)
}

// traceFinish notes the finish reasons in an event's data or a whole body
// (OpenAI's finish_reason, Anthropic's stop_reason), for
// gen_ai.response.finish_reasons. Called only when tracing is on.
func (x *exchange) traceFinish(data []byte) {
	if !x.trace.rec { // sampled out: not recorded
		return
	}
	for _, k := range finishKeys {
		for rest := data; ; {
			i := bytes.Index(rest, k)
			if i < 0 {
				break
			}
			rest = rest[i+len(k):]
			j := skipSpace(rest, 0)
			if j >= len(rest) || rest[j] != ':' {
				continue
			}
			j = skipSpace(rest, j+1)
			if j >= len(rest) || rest[j] != '"' {
				continue // null
			}
			end := bytes.IndexByte(rest[j+1:], '"')
			if end < 0 || end > 64 {
				continue
			}
			v := rest[j+1 : j+1+end]
			if !slices.Contains(x.trace.finish, string(v)) && len(x.trace.finish) < 8 {
				x.trace.finish = append(x.trace.finish, finishReason(v))
			}
			rest = rest[j+1+end:]
		}
	}
}

// startSpan starts an upstream attempt's CLIENT span, a child of the
// server span; the first attempt's is in the reqTrace, which the leg then
// holds until endSpan.
func (l *leg) startSpan() {
	x, tr := l.x, l.x.trace
	var s *tracing.Span
	if tr.nlegs < len(tr.legs) { // legs are started by the exchange's goroutine, one by one
		s = &tr.legs[tr.nlegs]
		tr.nlegs++
		tr.refs.Add(1) // let go by endSpan
	} else {
		s = new(tracing.Span)
	}
	l.span = s
	if !tr.rec { // sampled out: a span only for the backend's traceparent
		x.h.tracer.StartChild(s, &tr.span, "upstream", trace.SpanKindClient, time.Time{})
		return
	}
	var buf [4]attribute.KeyValue
	attrs := append(buf[:0], attrServerAddress.String(l.b.URL.Hostname()), attrAttempt.Int(x.retries))
	if p, err := strconv.Atoi(l.b.URL.Port()); err == nil {
		attrs = append(attrs, attrServerPort.Int(p))
	}
	if x.route != nil {
		attrs = append(attrs, attrPool.String(x.route.Pool.Name()))
	}
	x.h.tracer.StartChild(s, &tr.span, "upstream", trace.SpanKindClient, time.Now(), attrs...)
}

// injectSpan sets the upstream request's traceparent (and tracestate) to
// the attempt's span: the first attempt's header values are kept in the
// exchange (x.tp, written once: an exchange is never reused), a retry's
// or a hedge's in a Traceparent of its own.
func (l *leg) injectSpan(h http.Header) {
	x := l.x
	s := l.span.(*tracing.Span)
	tp := &x.tp
	if s != &x.trace.legs[0] {
		tp = new(tracing.Traceparent)
	}
	x.h.tracer.InjectTo(s, h, tp)
}

// endSpan ends the attempt's span with how the attempt went.
func (l *leg) endSpan() {
	s := l.span.(*tracing.Span)
	l.span = nil
	if tr := l.x.trace; tr != nil && s == &tr.legs[0] { // tr is nil only after the exchange let go, which waits for its legs
		defer tr.release() // the span is the reqTrace's: the leg's hold ends with it
	}
	if !s.IsRecording() {
		s.EndAt(time.Time{})
		return
	}
	var buf [4]attribute.KeyValue
	attrs := buf[:0]
	if l.hedge {
		attrs = append(attrs, attrHedge.Bool(true))
	}
	if l.resp != nil {
		attrs = append(attrs, attrHTTPStatus.Int(l.resp.StatusCode))
	}
	if !l.first.IsZero() {
		s.AddEventAt("first_token", l.first)
	}
	switch {
	case errors.Is(l.err, errHedgeLost) || errors.Is(l.ctx.Cause(), errHedgeLost) && l.err != nil:
		attrs = append(attrs, attrResult.String("hedge_lost"))
	case l.err != nil:
		attrs = append(attrs, attrResult.String("failed"), attrErrorType.String(ErrorOf(l.err).Code))
		s.SetStatus(codes.Error, l.err.Error())
	default:
		attrs = append(attrs, attrResult.String("relayed"))
	}
	s.SetAttrs(attrs)
	s.EndAt(time.Time{})
}
