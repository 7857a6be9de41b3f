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
)

// maxEventBytes bounds one SSE event from a backend.
const maxEventBytes = 1 << 20

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
	x.firstToken = l.first // before commit: the Server-Timing header reports it
	x.commit(l.resp.Header, true)
	ev, now := l.ev, l.first
	for {
		if done, err := x.relayEvent(l, ev, now); done || err != nil {
			return err
		}
		var err error
		ev, err = readEvent(l.br, (*l.bufp)[:0])
		*l.bufp = ev[:0]
		if err != nil {
			return x.streamFailed(causeOf(l.ctx, err))
		}
		now = time.Now()
		l.wd.tick(idle)
		l.b.Progress(now)
	}
}

// relayEvent handles one event of a committed stream: it records usage and
// tokens and sends the event on (the usage-only chunk only when the client
// asked for it). done is true after [DONE] or when the client is gone.
func (x *exchange) relayEvent(l *leg, ev []byte, now time.Time) (done bool, err error) {
	data := eventData(ev)
	switch {
	case data == nil: // comment, retry or id only: pass on
	case bytes.Equal(data, doneMarker):
		if x.wantsTimingComment() && !x.send(x.timingComment(), nil) {
			return true, context.Canceled
		}
		if !x.send(ev, data) {
			return true, context.Canceled
		}
		x.setTrailer()
		x.drainAfterDone(l.br, l.wd)
		return true, nil
	default:
		if u, usageOnly := usageOf(data); u != nil {
			x.usage = u
			if usageOnly && !x.meta.ClientUsage {
				return false, nil
			}
		} else if isToken(data) {
			x.tokens++
			x.tokenAt(now)
			x.lastToken = now
		}
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
func (x *exchange) streamFailed(err error) error {
	if cause := context.Cause(x.r.Context()); cause != nil {
		err = cause // the client went away, or the node is draining
	}
	if !errors.Is(err, context.Canceled) && !x.clientGone {
		e := statusOf(err)
		x.sent(x.sink.Error(e.Status, e.body()))
	}
	return err
}

// commit sends the response headers. For streams it drops Content-Length
// (the stream is edited) and marks the response as unbuffered.
func (x *exchange) commit(upstream http.Header, stream bool) {
	h := x.sink.Header()
	copyResponseHeader(h, upstream)
	h.Set("Server-Timing", x.serverTiming())
	if stream {
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no")
	}
	x.status = http.StatusOK
	x.sink.Start(http.StatusOK, stream)
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
			l.b.Progress(now)
			if !x.sent(x.sink.Raw(buf[:n])) {
				return context.Canceled
			}
		}
		if err == io.EOF {
			x.lastToken = time.Now()
			return nil
		}
		if err != nil {
			return x.streamFailed(causeOf(l.ctx, err))
		}
	}
}

// relayBody delivers a non-streamed answer, read whole by the leg.
func (x *exchange) relayBody(l *leg) error {
	x.firstToken = l.first
	if l.resp.StatusCode < 400 {
		if u, _ := usageOf(l.body); u != nil {
			x.usage = u
		}
	}
	x.passThrough(l.resp, l.body)
	return nil
}

// passThrough answers with a backend's status, headers and whole body.
func (x *exchange) passThrough(resp *http.Response, body []byte) {
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
	usageKey   = []byte(`"usage":`)
	contentKey = []byte(`"content":"`)
	textKey    = []byte(`"text":"`)
)

// isToken reports whether a chunk carries generated text (a chat delta's
// content or a completion's text), as opposed to the role chunk, the finish
// chunk or the usage chunk.
func isToken(data []byte) bool {
	for _, key := range [][]byte{contentKey, textKey} {
		if i := bytes.Index(data, key); i >= 0 && i+len(key) < len(data) && data[i+len(key)] != '"' {
			return true
		}
	}
	return false
}

// readEvent appends the next SSE event to buf: its lines up to and including
// the blank line that ends it. A stream that ends (before [DONE], which the
// caller stops at) gives errStreamCut.
func readEvent(br *bufio.Reader, buf []byte) ([]byte, error) {
	continued := false // the previous read ended inside a long line
	for {
		line, err := br.ReadSlice('\n')
		if len(buf)+len(line) > maxEventBytes {
			return buf, errEventTooLarge
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

// eventData returns the payload of an event's data lines (joined with "\n"
// when there are several), or nil when it has none.
func eventData(ev []byte) []byte {
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

// usageOf finds an OpenAI usage object in a chunk or body. usageOnly tells
// that the chunk carries no choices (the include_usage chunk). Only the
// top-level "usage" value is decoded: a body is scanned, not parsed whole.
func usageOf(data []byte) (u *limiter.Usage, usageOnly bool) {
	if !bytes.Contains(data, usageKey) {
		return nil, false
	}
	v := topLevelValue(data, "usage")
	if len(v) == 0 || v[0] != '{' {
		return nil, false // absent, or "usage":null
	}
	in, ok1 := intMember(v, "prompt_tokens")
	out, ok2 := intMember(v, "completion_tokens")
	if !ok1 || !ok2 {
		return nil, false
	}
	choices := bytes.TrimSpace(topLevelValue(data, "choices"))
	empty := len(choices) == 0 || string(choices) == "null" ||
		(choices[0] == '[' && len(bytes.TrimSpace(choices[1:len(choices)-1])) == 0)
	return &limiter.Usage{InputTokens: in, OutputTokens: out}, empty
}

// intMember reads an integer member of a JSON object: 0 when absent or
// null, ok false when it is not an integer.
func intMember(obj []byte, key string) (n int64, ok bool) {
	v := topLevelValue(obj, key)
	if v == nil || string(v) == "null" {
		return 0, true
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	return n, err == nil
}

// topLevelValue returns the raw value of key in the JSON object data (top
// level only, the first occurrence, names compared without case), or nil when
// data is not an object, has no such key, or is cut before the value ends.
// It checks the object's structure up to that value, not the rest.
func topLevelValue(data []byte, key string) []byte {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return nil
	}
	i++
	for {
		i = skipSpace(data, i)
		if i >= len(data) || data[i] != '"' {
			return nil
		}
		end := stringEnd(data, i)
		if end < 0 {
			return nil
		}
		k := data[i+1 : end-1]
		i = skipSpace(data, end)
		if i >= len(data) || data[i] != ':' {
			return nil
		}
		i = skipSpace(data, i+1)
		vend := valueEnd(data, i)
		if vend < 0 {
			return nil
		}
		if bytes.EqualFold(k, []byte(key)) { // as encoding/json matches names
			return data[i:vend]
		}
		i = skipSpace(data, vend)
		if i >= len(data) || data[i] != ',' {
			return nil
		}
		i++
	}
}

func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index after the JSON string starting at data[i]
// (a quote), or -1 when it is not terminated.
func stringEnd(data []byte, i int) int {
	for j := i + 1; j < len(data); j++ {
		switch data[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// valueEnd returns the index after the JSON value starting at data[i], or
// -1 when it is cut (a value of an object member cannot end the data).
func valueEnd(data []byte, i int) int {
	if i >= len(data) {
		return -1
	}
	switch data[i] {
	case '"':
		return stringEnd(data, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(data); j++ {
			switch data[j] {
			case '"':
				if j = stringEnd(data, j); j < 0 {
					return -1
				}
				j-- // the loop's j++ moves past the quote
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(data) && !endsScalar(data[j]) {
		j++
	}
	if j == i || j == len(data) {
		return -1
	}
	return j
}

// endsScalar reports whether c ends a number, true, false or null.
func endsScalar(c byte) bool {
	switch c {
	case ',', '}', ']', ' ', '\t', '\r', '\n':
		return true
	}
	return false
}
