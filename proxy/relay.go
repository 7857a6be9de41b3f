package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/routing"
)

// MaxEventBytes bounds one SSE event from a backend; a longer one fails
// the stream with ErrEventTooLarge.
const MaxEventBytes = 1 << 20

// relayBufferSize is the size of a stream's read buffer, held for the
// stream's life: events are far smaller, and a longer line is read in
// pieces (see readEvent).
const relayBufferSize = 4 << 10

var (
	readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, relayBufferSize) }}
	// eventPool holds a stream's current event: a few hundred bytes
	// usually; a buffer that grew past maxPooledEvent is dropped.
	eventPool = sync.Pool{New: func() any { b := make([]byte, 0, 1<<10); return &b }}
	rawPool   = sync.Pool{New: func() any { b := make([]byte, relayBufferSize); return &b }}
)

const maxPooledEvent = 64 << 10

// putEvent returns an event buffer to its pool unless it grew too large.
func putEvent(bufp *[]byte) {
	if cap(*bufp) <= maxPooledEvent {
		eventPool.Put(bufp)
	}
}

// relayOpenAI commits a leg whose first event is held and relays the
// stream event by event, flushing each as it arrives. It records the usage
// chunk and removes it when the client did not ask for it.
func (x *exchange) relayOpenAI(l *leg) error {
	idle := x.st.Config.StreamIdleTimeout
	if ok, err := x.handOff(l); ok {
		return err // the event loop relays the stream (handoff.go)
	}
	x.firstToken = l.first // before commit: the Server-Timing header reports it
	x.announceTrailer(x.sink.Header())
	x.commit(l.resp.Header, true)
	ev, now := l.ev, l.first
	for first := true; ; first = false {
		if done, err := x.relayEvent(l, ev, now); done || err != nil {
			return err
		}
		if first {
			// What arrived with the first event leaves now, on this
			// goroutine, as an HTTP/1.1 hand-off sends it with the head:
			// vLLM's first iteration sends the role-only chunk and the
			// first token together, and the token a client's TTFT counts
			// must not wait for a loop's start (an HTTP/2 stream's) or for
			// the next read.
			if done, err := x.relayBuffered(l); done || err != nil {
				return err
			}
			x.firstSent = time.Now()
			if ok, err := x.handOffFramed(l); ok {
				return err // an event loop relays the rest (handoff_h2.go)
			}
		}
		var err error
		ev, err = readEvent(l.br, (*l.bufp)[:0])
		*l.bufp = ev[:0]
		if err != nil {
			return x.streamFailed(l, causeOf(&l.ctx, err))
		}
		now = time.Now()
		l.wd.tick(idle)
		l.att.Progress(now)
	}
}

// relayEvent handles one event of a committed stream: it records usage and
// tokens and sends the event on (the usage-only chunk only when the client
// asked for it). done is true after [DONE] or when the client is gone.
func (x *exchange) relayEvent(l *leg, ev []byte, now time.Time) (done bool, err error) {
	ev = x.alias.restore(ev) // the public model name back (alias.go)
	data := EventData(ev)
	if data == nil { // comment, retry or id only: pass on
		return !x.send(ev, nil), nil
	}
	if x.trace != nil {
		x.traceFinish(data)
	}
	switch x.classify(ev, data) {
	case eventToken:
		x.tokens++
		x.tokenAt(now)
		x.lastToken = now
	case eventUsageDrop:
		return false, nil
	case eventEnd, eventFailed:
		// The stream's last event ([DONE], response.completed, message_stop,
		// or the backend's own error event): the timing comment goes before
		// it (a client may stop reading at it), then the trailer, which
		// leaves with it (see sendLast).
		if x.wantsTimingComment() && !x.send(x.timingComment(), nil) {
			return true, context.Canceled
		}
		if !x.sendLast(ev, data) {
			return true, context.Canceled
		}
		x.setTrailer()
		if l.br != nil { // (nil on the event loop: the backend's socket is closed)
			x.drainAfterDone(l.br, &l.wd)
		}
		if x.lastToken.IsZero() {
			x.lastToken = now
		}
		return true, nil
	}
	if !x.send(ev, data) {
		return true, context.Canceled
	}
	return false, nil
}

// send delivers one event (and its data payload) to the sink; false means
// the client is gone.
func (x *exchange) send(ev, data []byte) bool {
	n, err := x.sink.Event(ev, data)
	return x.sent(n, err)
}

// lastEventSink is a sink that can hold a stream's last event and write it
// in End together with the trailer (httpSink).
type lastEventSink interface {
	Last(ev, data []byte) (n int, err error)
}

// sendLast delivers a stream's last event. When a trailer follows, a sink
// that can holds the event for End, which writes it and the trailer in one
// go: Chromium fails a streaming fetch over HTTP/3 whose trailer arrives
// in a later packet than the body's end.
func (x *exchange) sendLast(ev, data []byte) bool {
	if s, ok := x.sink.(lastEventSink); ok && wantsTrailer(x.r) {
		return x.sent(s.Last(ev, data))
	}
	return x.send(ev, data)
}

// sent counts what reached the client; false means the client is gone.
func (x *exchange) sent(n int, err error) bool {
	x.bytesToUser += int64(n)
	if err != nil {
		x.clientGone = true
		return false
	}
	return true
}

// drainAfterDone reads the end of the backend's body after [DONE] so the
// connection can be reused, giving it little time.
func (x *exchange) drainAfterDone(br *bufio.Reader, wd *watchdog) {
	wd.tick(100 * time.Millisecond)
	io.Copy(io.Discard, io.LimitReader(br, 64<<10))
}

// streamFailed ends a committed stream whose backend failed with an error
// event (unless the client is gone).
func (x *exchange) streamFailed(l *leg, err error) error {
	if cause := context.Cause(x.r.Context()); cause != nil {
		err = cause // the client went away, or the node is draining
	} else {
		x.logAttempt(x.backend, err)
		l.outcome = routing.Failed // a mid-stream abort counts against the backend
	}
	if !errors.Is(err, context.Canceled) && !x.clientGone {
		e := ErrorOf(err)
		x.sent(x.sink.Error(e.Status, x.streamErrorBody(e)))
	}
	return err
}

// commit sends the response headers. For streams it drops Content-Length
// (the stream is edited) and marks the response as unbuffered.
func (x *exchange) commit(upstream http.Header, stream bool) {
	x.commitHeader(upstream, stream)
	x.sink.Start(http.StatusOK, stream)
}

// commitHeader sets the response header of commit (the event loop's hand
// off writes the head itself).
func (x *exchange) commitHeader(upstream http.Header, stream bool) {
	h := x.sink.Header()
	copyResponseHeader(h, upstream)
	h.Set("Server-Timing", x.serverTiming())
	if stream {
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no")
	}
	x.status = http.StatusOK
}

// relayRaw relays a generic event stream byte for byte: headers at once (an
// idle EventSource must see them), every read flushed as it arrives.
func (x *exchange) relayRaw(l *leg) error {
	x.commit(l.resp.Header, true)
	if _, err := x.sink.Raw(nil); err != nil {
		return context.Canceled
	}
	bufp := rawPool.Get().(*[]byte)
	defer rawPool.Put(bufp)
	buf := *bufp
	for {
		n, err := l.resp.Body.Read(buf)
		if n > 0 {
			now := time.Now()
			if x.firstToken.IsZero() {
				x.firstToken = now
			}
			l.att.Progress(now)
			if !x.sent(x.sink.Raw(buf[:n])) {
				return context.Canceled
			}
		}
		if err == io.EOF {
			x.lastToken = time.Now()
			return nil
		}
		if err != nil {
			return x.streamFailed(l, causeOf(&l.ctx, err))
		}
	}
}

// passThrough answers with a backend's status, headers and whole body
// (the last attempt's 5xx, read up to 64KiB; see relayBody for the
// non-streamed answers of the winning leg).
func (x *exchange) passThrough(resp *http.Response, body []byte) {
	body = x.alias.restoreBody(body) // the public model name back (alias.go)
	h := x.sink.Header()
	copyResponseHeader(h, resp.Header)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Server-Timing", x.serverTiming())
	x.status = resp.StatusCode
	x.sink.Start(resp.StatusCode, false)
	n, _ := x.sink.Body(body)
	x.bytesToUser += int64(n)
}

var (
	doneMarker = []byte("[DONE]")
	dataPrefix = []byte("data:")
	usageKey   = []byte(`"usage"`) // a backend may write `"usage": {`
)

// readEvent appends the next SSE event to buf: its lines up to and including
// the blank line that ends it. A stream that ends (before [DONE], which the
// caller stops at) gives errStreamCut.
func readEvent(br *bufio.Reader, buf []byte) ([]byte, error) {
	continued := false // the previous read ended inside a long line
	for {
		line, err := br.ReadSlice('\n')
		if len(buf)+len(line) > MaxEventBytes {
			return buf, ErrEventTooLarge
		}
		buf = append(buf, line...)
		switch {
		case err == bufio.ErrBufferFull:
			continued = true
			continue
		case err == io.EOF:
			return buf, errStreamCut
		case err != nil:
			return buf, err
		}
		blank := !continued && (len(line) == 1 || (len(line) == 2 && line[0] == '\r'))
		continued = false
		if blank {
			if len(buf) > len(line) {
				return buf, nil
			}
			buf = buf[:0] // stray blank line between events
		}
	}
}

// EventData returns the payload of an event's data lines (joined with "\n"
// when there are several), or nil when it has none.
func EventData(ev []byte) []byte {
	var out []byte
	n := 0
	for len(ev) > 0 {
		line := ev
		if i := bytes.IndexByte(ev, '\n'); i >= 0 {
			line, ev = ev[:i], ev[i+1:]
		} else {
			ev = nil
		}
		line = bytes.TrimSuffix(line, []byte("\r"))
		if !bytes.HasPrefix(line, dataPrefix) {
			continue
		}
		payload := line[len(dataPrefix):]
		if len(payload) > 0 && payload[0] == ' ' {
			payload = payload[1:]
		}
		if n == 0 {
			out = payload
		} else {
			out = append(append(append([]byte(nil), out...), '\n'), payload...)
		}
		n++
	}
	return out
}

// usageOf reads the usage of an OpenAI chunk or non-streamed body, with
// names compared exactly and the last of a repeated name winning (as the
// clients' JSON.parse and Python's json read it), the types as
// json.Unmarshal reads them into
//
//	struct {
//		Choices []json.RawMessage `json:"choices"`
//		Usage   *struct {
//			PromptTokens     int64 `json:"prompt_tokens"`
//			CompletionTokens int64 `json:"completion_tokens"`
//		} `json:"usage"`
//	}
//
// (usageBody in the tests): nil when data is not valid JSON,
// when a field has the wrong type, or when its last "usage" is null or
// absent. usageOnly tells that the chunk carries no choices (the last
// "choices" is null, empty or absent: the include_usage chunk). Chunks
// without the bytes "usage" are not read (most of a stream's).
func usageOf(data []byte) (u *limiter.Usage, usageOnly bool) {
	v, ok, usageOnly := usageFrom(data)
	if !ok {
		return nil, false
	}
	return &v, usageOnly
}

// usageFrom is usageOf without the allocation: ok is false where usageOf
// returns nil.
func usageFrom(data []byte) (u limiter.Usage, ok, usageOnly bool) {
	i := bytes.Index(data, usageKey)
	if i < 0 || usageNull(data, i) {
		return u, false, false
	}
	var f usageFields
	if !f.scan(data) || !f.usage {
		return u, false, false
	}
	return limiter.Usage{InputTokens: f.in, OutputTokens: f.out}, true, !f.choices
}

// setUsage sets x.usage to u, held in the exchange (a later report
// overwrites it: the last one counts).
func (x *exchange) setUsage(u limiter.Usage) {
	x.usageVal = u
	x.usage = &x.usageVal
}

// usageNull reports that data's first "usage" (at i) is followed by
// null, that it is the only one, and that no name in data is escaped
// (\u: "\u0075sage" is usage too): usageOf is then nil whatever else
// data holds, valid or not. The bytes are the top-level object's usage
// member, null; or they are not a top-level member (nested, or inside a
// string with an escaped quote before them), and the object has no usage
// member. It spares the scan of every chunk of a stream whose client
// asked for usage (stream_options.include_usage: "usage":null in each
// chunk but the last).
func usageNull(data []byte, i int) bool {
	j := skipSpace(data, i+len(usageKey))
	if j >= len(data) || data[j] != ':' {
		return false
	}
	j = skipSpace(data, j+1)
	if !bytes.HasPrefix(data[j:], nullLiteral) {
		return false
	}
	return !bytes.Contains(data[j:], usageKey) && !bytes.Contains(data, escapeU)
}

var (
	nullLiteral = []byte("null")
	escapeU     = []byte(`\u`)
)

// usageFields is what usageOf reads, as json.Unmarshal leaves it.
type usageFields struct {
	// choices is set when Choices is not empty.
	choices bool
	// usage is set when Usage is not nil; in and out are its tokens.
	usage   bool
	in, out int64
}

var (
	usageNames = []string{"choices", "usage"}
	tokenNames = []string{"prompt_tokens", "completion_tokens"}
)

// scan reads data in one pass, checking that it is valid JSON, and sets f
// as json.Unmarshal would. It reports false when data is
// not valid, not an object, or a field has the wrong type.
func (f *usageFields) scan(data []byte) bool {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return false // null has no usage either
	}
	end := scanObject(data, i, 1, func(key []byte, v int) int {
		switch exact, _ := fieldIndex(key, usageNames); exact {
		case 0:
			return f.scanChoices(data, v)
		case 1:
			return f.scanUsage(data, v)
		}
		return skipValue(data, v, 1)
	})
	return end >= 0 && skipSpace(data, end) == len(data)
}

// scanChoices reads the choices value at data[v]: a later array replaces
// an earlier one, null empties it.
func (f *usageFields) scanChoices(data []byte, v int) int {
	switch data[v] {
	case 'n':
		f.choices = false
		return literalEnd(data, v, "null")
	case '[':
		i := skipSpace(data, v+1)
		f.choices = i < len(data) && data[i] != ']'
		return skipValue(data, v, 1)
	}
	return -1
}

// scanUsage reads the usage value at data[v]: null clears it, a repeated
// object replaces the first (as clients' JSON.parse and json.loads do),
// null tokens keep their value.
func (f *usageFields) scanUsage(data []byte, v int) int {
	switch data[v] {
	case 'n':
		f.usage, f.in, f.out = false, 0, 0
		return literalEnd(data, v, "null")
	case '{':
		f.usage, f.in, f.out = true, 0, 0
		return scanObject(data, v, 2, func(key []byte, v int) int {
			n := &f.in
			switch exact, _ := fieldIndex(key, tokenNames); exact {
			case 0:
			case 1:
				n = &f.out
			default:
				return skipValue(data, v, 2)
			}
			if data[v] == 'n' {
				return literalEnd(data, v, "null")
			}
			x, end := intNumber(data, v)
			if end >= 0 {
				*n = x
			}
			return end
		})
	}
	return -1
}
