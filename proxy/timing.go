package proxy

import (
	"encoding/json"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluice-proxy/sluice/proxy/listen"
	"github.com/sluice-proxy/sluice/proxy/observe"
)

// timingCommentHeader lets a client ask for the final timing as an SSE
// comment line (for browsers' EventSource, which cannot read trailers).
const timingCommentHeader = "X-Sluice-Timing"

// maxITLSamples bounds the inter-token samples kept per request; beyond it
// the ITL percentiles cover the first samples only (4 bytes each).
const maxITLSamples = 1 << 16

var itlPool = sync.Pool{New: func() any { s := make([]uint32, 0, 256); return &s }}

// tokenAt records a token event at t: an ITL sample for every token after
// the first.
func (x *exchange) tokenAt(t time.Time) {
	if !x.lastTokenAt.IsZero() {
		if x.itl == nil {
			x.itl = itlPool.Get().(*[]uint32)
		}
		if len(*x.itl) < maxITLSamples {
			*x.itl = append(*x.itl, uint32(min(t.Sub(x.lastTokenAt).Microseconds(), math.MaxUint32)))
		}
	}
	x.lastTokenAt = t
}

// releaseITL returns the sample buffer to its pool.
func (x *exchange) releaseITL() {
	if x.itl != nil {
		*x.itl = (*x.itl)[:0]
		itlPool.Put(x.itl)
		x.itl = nil
	}
}

// stage returns a stage's duration and whether it was measured.
func (x *exchange) stage(name string) (time.Duration, bool) {
	between := func(a, b time.Time) (time.Duration, bool) {
		if a.IsZero() || b.IsZero() {
			return 0, false
		}
		return max(b.Sub(a), 0), true
	}
	switch name {
	case observe.StageNetRTT:
		return x.netRTT()
	case observe.StageTLS:
		return x.conn.Handshake, x.conn.Handshake > 0
	case observe.StageAuth:
		return between(x.start, x.authDone)
	case observe.StageRecv:
		return between(x.authDone, x.bodyRead)
	case observe.StageRoute:
		return between(x.bodyRead, x.routed)
	case observe.StageLimit:
		return between(x.routed, x.limited)
	case observe.StageQueue:
		return x.queueWait, !x.limited.IsZero() && x.route != nil
	case observe.StageUpstream:
		return between(x.picked, x.upstreamHeaders)
	case observe.StagePrefill:
		return between(x.upstreamHeaders, x.firstToken)
	case observe.StageTTFT:
		return between(x.start, x.firstToken)
	case observe.StageEdge:
		ttft, ok := between(x.start, x.firstToken)
		if !ok {
			return 0, false
		}
		up, _ := between(x.picked, x.firstToken)
		recv, _ := between(x.authDone, x.bodyRead)
		return max(ttft-up-recv-x.queueWait, 0), true
	case observe.StageDecode:
		return between(x.firstToken, x.lastToken)
	case observe.StageHold:
		return between(x.firstToken, x.firstSent)
	}
	return 0, false
}

// appendMetric appends one W3C Server-Timing entry, name;dur=<ms>, to the
// value that begins at b[start] (b may hold other bytes before it:
// relayBody's Content-Length digits), after a separator unless it is the
// value's first.
func appendMetric(b []byte, start int, name string, d time.Duration) []byte {
	if len(b) > start {
		b = append(b, ", "...)
	}
	b = append(b, name...)
	b = append(b, ";dur="...)
	return appendMillis(b, d)
}

// appendMillis appends d in milliseconds with three decimals, the text
// strconv.AppendFloat(b, float64(d)/1e6, 'f', 3, 64) makes, in integer
// arithmetic (a float's formatting costs several times more; a request's
// Server-Timing has up to nine): d rounded to the microsecond. Exact ties
// (d%1000 == 500) round as the float does, and so do negative and very
// long durations (under 2^40 ns, 18 minutes, the float's error is far
// below the nanosecond that separates any other d from a tie).
func appendMillis(b []byte, d time.Duration) []byte {
	if d < 0 || d >= 1<<40 || d%1000 == 500 {
		return strconv.AppendFloat(b, float64(d)/1e6, 'f', 3, 64)
	}
	us := (d + 500) / 1000
	b = strconv.AppendInt(b, int64(us/1000), 10)
	f := us % 1000
	return append(b, '.', byte('0'+f/100), byte('0'+f/10%10), byte('0'+f%10))
}

// serverTiming is the initial Server-Timing value: every stage measured so
// far.
func (x *exchange) serverTiming() string {
	x.timing = string(x.appendServerTiming(make([]byte, 0, 256)))
	return x.timing
}

// appendServerTiming appends the initial Server-Timing value to b, which
// may already hold other bytes (relayBody's Content-Length digits).
func (x *exchange) appendServerTiming(b []byte) []byte {
	start := len(b)
	for _, s := range observe.HeaderStages {
		if d, ok := x.stage(s); ok {
			b = appendMetric(b, start, s, d)
		}
	}
	return b
}

// itlPercentiles returns the P50, P99 and max of the ITL samples.
func (x *exchange) itlPercentiles() (p50, p99, maxd time.Duration, n int) {
	if x.itl == nil || len(*x.itl) == 0 {
		return 0, 0, 0, 0
	}
	s := slices.Clone(*x.itl)
	slices.Sort(s)
	rank := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return time.Duration(s[max(i, 0)]) * time.Microsecond
	}
	return rank(0.50), rank(0.99), time.Duration(s[len(s)-1]) * time.Microsecond, len(s)
}

// appendDesc appends one Server-Timing entry whose value is not a
// duration: name;desc="<v>". A count or a rate in dur would show in
// browsers' devtools as milliseconds. start is as appendMetric's.
func appendDesc(b []byte, start int, name string, v float64, prec int) []byte {
	if len(b) > start {
		b = append(b, ", "...)
	}
	b = append(b, name...)
	b = append(b, `;desc="`...)
	b = strconv.AppendFloat(b, v, 'f', prec, 64)
	return append(b, '"')
}

// finalTiming is the end-of-stream timing: decode and the ITL percentiles
// (dur, milliseconds), the output tokens and tokens per second (desc: a
// count and a rate are not durations).
func (x *exchange) finalTiming() string {
	b := make([]byte, 0, 180)
	if hold, ok := x.stage(observe.StageHold); ok {
		b = appendMetric(b, 0, observe.StageHold, hold)
	}
	decode, _ := x.stage(observe.StageDecode)
	b = appendMetric(b, 0, observe.StageDecode, decode)
	p50, p99, mx, _ := x.itlPercentiles()
	b = appendMetric(b, 0, "itl-p50", p50)
	b = appendMetric(b, 0, "itl-p99", p99)
	b = appendMetric(b, 0, "itl-max", mx)
	tokens := x.outputTokens()
	b = appendDesc(b, 0, "tokens", float64(tokens), 0)
	tps := 0.0
	if decode > 0 && tokens > 1 {
		tps = float64(tokens-1) / decode.Seconds()
	}
	b = appendDesc(b, 0, "tps", math.Round(tps*10)/10, 1)
	return string(b)
}

// outputTokens is the backend's count when it reported usage, else the
// number of token events relayed.
func (x *exchange) outputTokens() int64 {
	if x.usage != nil {
		return x.usage.OutputTokens
	}
	return x.tokens
}

// wantsTrailer reports whether the client asked for trailers ("TE:
// trailers"), on every protocol. Browsers never send it (fetch forbids the
// header), so they get no trailer: Chromium fails a streaming fetch over
// HTTP/3 when a trailer arrives after the body, and reads none anyway.
func wantsTrailer(r *http.Request) bool {
	if !r.ProtoAtLeast(1, 1) {
		return false // HTTP/1.0: no chunked coding, no trailer
	}
	for _, v := range r.Header.Values("Te") {
		for _, f := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(strings.SplitN(f, ";", 2)[0]), "trailers") {
				return true
			}
		}
	}
	return false
}

// wantsTimingComment reports whether the final timing goes into the stream
// as an SSE comment: asked by the client ("X-Sluice-Timing: comment") or
// set on the route.
func (x *exchange) wantsTimingComment() bool {
	return x.policy.TimingComment || strings.EqualFold(x.r.Header.Get(timingCommentHeader), "comment")
}

// timingComment is the final timing as an SSE comment line.
func (x *exchange) timingComment() []byte {
	return []byte(": server-timing " + x.finalTiming() + "\n\n")
}

// trailerAnnounce is the response header key that announces the trailer.
// It is deliberately not in canonical form ("Trailer"): the servers would
// then treat Server-Timing as a declared trailer, and quic-go v0.65.0's
// http3 (response_writer.go, encodeHeader) drops a declared trailer's
// name from the header, which carries the initial Server-Timing. Header
// names are case-insensitive on the wire; the value itself goes out
// through http.TrailerPrefix in End.
const trailerAnnounce = "trailer"

// announceTrailer declares the Server-Timing trailer in the response
// header when the client asked for trailers; commit calls it before the
// header is sent.
func (x *exchange) announceTrailer(h http.Header) {
	if wantsTrailer(x.r) {
		h[trailerAnnounce] = []string{"Server-Timing"}
	}
}

// setTrailer sets the Server-Timing trailer, for End, when the client can
// read it.
func (x *exchange) setTrailer() {
	if wantsTrailer(x.r) {
		x.trailer = http.Header{"Server-Timing": {x.finalTiming()}}
	}
}

// whileWaiting is the exchange's work while the backend works on its
// request (attemptCtx.Waiting, on the handler's goroutine; a transport
// other than h1up never calls it, and what it does is then done where it
// is first needed): the client's round-trip time, a system call the
// head's Server-Timing needs (≈ 20 µs P50 at target 1's 64 streams,
// where the first token waited for it).
func (x *exchange) whileWaiting() {
	x.netRTT()
}

// netRTT returns the connection's RTT estimate, read from the transport
// once per request (a TCP_INFO system call) and kept: the Server-Timing
// header, metrics, stats and the access log all report the same value.
func (x *exchange) netRTT() (time.Duration, bool) {
	if !x.rttRead {
		if x.conn.RTT != nil {
			x.rtt = x.conn.RTT()
		}
		x.rttRead = true
	}
	return x.rtt, x.rtt > 0
}

// protoOf names a request's protocol for metrics and logs.
func protoOf(r *http.Request, c listen.ConnInfo) string {
	if c.Proto != "" {
		return c.Proto
	}
	switch r.ProtoMajor {
	case 2:
		return "h2"
	case 3:
		return "h3"
	}
	return "h1"
}

// timingJSON is what the pipeline measured for one request, as a JSON
// object in Server-Timing order with Server-Timing's names: every stage
// measured (milliseconds; see docs/TIMING.md), then decode, the ITL
// percentiles and maximum (ms), tokens (the output token count), tps (tokens
// per second while decoding) and e2e (ms, the whole request at the edge).
func timingJSON(x *exchange, now time.Time) json.RawMessage {
	b := make([]byte, 0, 256)
	add := func(name string, v float64) {
		if len(b) == 0 {
			b = append(b, '{')
		} else {
			b = append(b, ',')
		}
		b = strconv.AppendQuote(b, name)
		b = append(b, ':')
		b = strconv.AppendFloat(b, v, 'f', -1, 64)
	}
	for _, s := range observe.HeaderStages {
		if d, ok := x.stage(s); ok {
			add(s, roundMillis(d))
		}
	}
	if d, ok := x.stage(observe.StageHold); ok {
		add(observe.StageHold, roundMillis(d))
	}
	if d, ok := x.stage(observe.StageDecode); ok {
		add(observe.StageDecode, roundMillis(d))
		tokens := x.outputTokens()
		if p50, p99, mx, n := x.itlPercentiles(); n > 0 {
			add("itl-p50", roundMillis(p50))
			add("itl-p99", roundMillis(p99))
			add("itl-max", roundMillis(mx))
		}
		add("tokens", float64(tokens))
		if d > 0 && tokens > 1 {
			add("tps", math.Round(float64(tokens-1)/d.Seconds()*10)/10)
		}
	}
	add(observe.StageE2E, roundMillis(now.Sub(x.start)))
	return append(b, '}')
}

// roundMillis is d in milliseconds, to the microsecond.
func roundMillis(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }
