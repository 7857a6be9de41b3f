package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-proxy/sluice/routing"
)

// Non-streamed responses are streamed through, never held whole. A leg
// reads the body's head into one window (respWindow bytes, pooled and
// reserved from response_memory_bytes) before it is ready, so that a
// backend failing before its first bytes can still be retried or lose a
// hedge; a body that fits in the window is then answered whole, as
// before, with its exact Content-Length. A longer one is committed with
// the head and copied to the client through the same window, each piece
// written and flushed as it arrives, while a usageScanner reads the
// top-level "usage" member on the way (OpenAI's usage comes last, Anthropic's
// and the Responses API's too in a non-streamed body): nothing but the
// window and the usage member's bytes is held, whatever the body's size.

// respWindow is the buffer a non-streamed response is read through.
const respWindow = 32 << 10

// maxUsageBytes bounds the top-level usage member's value kept by the
// scanner; a longer one is not read (the request settles as without usage).
const maxUsageBytes = 16 << 10

var windowPool = sync.Pool{New: func() any { b := make([]byte, respWindow); return &b }}

// bodyCutError ends a non-streamed body that failed after its head was
// sent: the client's connection (HTTP/1.1) or stream (HTTP/2, HTTP/3) is
// reset so that a short body never looks whole (see ServeHTTP).
type bodyCutError struct{ err error }

func (e *bodyCutError) Error() string { return "non-streamed body cut: " + e.err.Error() }
func (e *bodyCutError) Unwrap() error { return e.err }

// isBodyCut reports whether a request's outcome error is a non-streamed
// body that was cut after it started (the relay's own error, as returned:
// a type check, which allocates nothing on every request's path).
func isBodyCut(err error) bool {
	_, ok := err.(*bodyCutError)
	return ok
}

// readHead reads the head of a non-streamed answer: up to respWindow bytes
// or the whole body when it is shorter, within the first-token deadline.
// l.body is the head; l.more tells that the body goes on.
func (l *leg) readHead() {
	x := l.x
	limit := int64(x.st.Config.MaxResponseBytes)
	if l.resp.ContentLength > limit {
		l.fail(errResponseTooLarge, false)
		return
	}
	if !x.h.responses.reserve(respWindow, int64(x.st.Config.ResponseMemoryBytes)) {
		l.fail(errResponseMemory, false)
		return
	}
	l.window = windowPool.Get().(*[]byte)
	buf := *l.window
	n := 0
	for n < len(buf) {
		m, err := l.resp.Body.Read(buf[n:])
		n += m
		if err == io.EOF {
			break
		}
		if err != nil {
			l.fail(causeOf(&l.ctx, err), true)
			return
		}
	}
	if int64(n) > limit {
		l.fail(errResponseTooLarge, false)
		return
	}
	l.body, l.more, l.first = buf[:n], n == len(buf), time.Now()
	if l.resp.StatusCode < 400 {
		l.att.Progress(l.first)
	}
	if l.more {
		l.wd.tick(x.st.Config.StreamIdleTimeout)
	}
}

// releaseWindow gives the leg's window back to its pool and its bytes
// back to the node's response budget.
func (l *leg) releaseWindow() {
	if l.window == nil {
		return
	}
	windowPool.Put(l.window)
	l.window, l.body = nil, nil
	l.x.h.responses.release(respWindow)
}

// bodyOut writes a non-streamed body's pieces to the sink, counting what
// reached the client; flush pushes each piece out at once (a body longer
// than the window).
type bodyOut struct {
	x     *exchange
	flush bool
}

func (o *bodyOut) Write(p []byte) (int, error) {
	n, err := o.x.sink.Body(p)
	if err == nil && o.flush {
		if hs, ok := o.x.sink.(*httpSink); ok {
			err = hs.rc.Flush()
		}
	}
	if !o.x.sent(n, err) {
		return n, context.Canceled
	}
	return n, nil
}

// relayBody delivers a non-streamed answer: the head the leg read, then,
// when the body is longer, the rest as it arrives. Usage is read from a
// successful body: whole when it fits in the head, else by a usageScanner
// as it passes.
func (x *exchange) relayBody(l *leg) error {
	x.firstToken = l.first
	resp := l.resp
	scan := resp.StatusCode < 400
	l.out = bodyOut{x: x, flush: l.more}
	// The one place a non-streamed body's writer may be wrapped (e.g. to
	// restore an alias's model name): a wrapper that changes the bytes
	// sets unchanged to false, so that Content-Length is dropped; one that
	// holds bytes between writes implements io.Closer, called once at the
	// body's end (not when it was cut).
	var w io.Writer = &l.out
	unchanged := true
	head := l.body
	if x.alias != nil {
		if l.more {
			w, unchanged = newRestoreWriter(x.alias, w), false
		} else {
			head = x.alias.restoreBody(l.body) // whole: its exact length below
		}
	}
	if x.trace != nil {
		x.traceFinish(l.body) // finish reasons for the span (the rest: below)
	}

	h := x.sink.Header()
	copyResponseHeader(h, resp.Header)
	if unchanged && l.more && resp.ContentLength >= 0 {
		h.Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	}
	if !l.more {
		if scan {
			x.usageOfBody(l.body)
		}
		// The whole body's exact length and the timing: both values in
		// one string, their slices pointing into the exchange.
		v := &x.endVals
		b := make([]byte, 0, 256)
		if unchanged {
			b = strconv.AppendInt(b, int64(len(head)), 10)
		}
		k := len(b)
		all := string(x.appendServerTiming(b))
		x.timing, v[1] = all[k:], all[k:]
		if unchanged {
			v[0] = all[:k]
			h["Content-Length"] = v[0:1:1]
		}
		h["Server-Timing"] = v[1:2:2]
		x.status = resp.StatusCode
		x.sink.Start(resp.StatusCode, false)
		if _, err := w.Write(head); err == nil {
			closeBody(w)
		}
		return nil
	}

	h.Set("Server-Timing", x.serverTiming())
	x.status = resp.StatusCode
	x.sink.Start(resp.StatusCode, false)
	var sc usageScanner
	if scan {
		sc.feed(l.body)
	}
	if _, err := w.Write(l.body); err != nil {
		return &bodyCutError{context.Canceled}
	}
	idle := x.st.Config.StreamIdleTimeout
	limit := int64(x.st.Config.MaxResponseBytes)
	total := int64(len(l.body))
	buf := *l.window
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			total += int64(n)
			if total > limit {
				return x.bodyCut(l, errResponseTooLarge)
			}
			now := time.Now()
			l.wd.tick(idle)
			if x.trace != nil {
				x.traceFinish(buf[:n])
			}
			if scan {
				sc.feed(buf[:n])
				l.att.Progress(now)
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				return &bodyCutError{context.Canceled}
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return x.bodyCut(l, causeOf(&l.ctx, err))
		}
	}
	if closeBody(w) != nil {
		return &bodyCutError{context.Canceled}
	}
	x.lastToken = time.Now()
	if scan {
		if u, ok := sc.usage(); ok {
			x.usageOfBody(u)
		}
	}
	x.setTrailer()
	return nil
}

// closeBody closes a writer wrapper that holds bytes (see relayBody).
func closeBody(w io.Writer) error {
	if c, ok := w.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// usageOfBody reads the usage of a whole non-streamed body (or of the
// object {"usage":…} the scanner rebuilt) into x.usage.
func (x *exchange) usageOfBody(body []byte) {
	if x.dialect == dialectResponses || x.dialect == dialectMessages {
		x.readUsage(body)
	} else if u, ok, _ := usageFrom(body); ok {
		x.setUsage(u)
	}
}

// bodyCut ends a non-streamed body that failed after it started: the
// attempt counts against the backend (unless the client left or the node
// is draining) and the client's response is reset.
func (x *exchange) bodyCut(l *leg, err error) error {
	if cause := context.Cause(x.r.Context()); cause != nil {
		return &bodyCutError{cause}
	}
	x.logAttempt(x.backend, err)
	l.outcome = routing.Failed
	if !errors.Is(err, errStreamIdle) && !errors.Is(err, errResponseTooLarge) && !errors.Is(err, errStreamCut) {
		err = fmt.Errorf("%w: %w", errStreamCut, err)
	}
	return &bodyCutError{err}
}

// abortIfCut resets the client's response when its non-streamed body was
// cut: net/http and quic-go recover http.ErrAbortHandler by closing the
// HTTP/1.1 connection (no final chunk, or fewer bytes than Content-Length)
// or resetting the HTTP/2 or HTTP/3 stream.
func abortIfCut(o Outcome) {
	if isBodyCut(o.Err) {
		panic(http.ErrAbortHandler)
	}
}

// usageScanner finds the top-level "usage" member of a JSON object fed to
// it in pieces of any size, keeping only that member's value (the last one
// when repeated, as JSON.parse and json.loads read it): a few hundred
// bytes, whatever the body's size. It checks the body's structure (one
// object, strings closed, brackets matched, nothing after it), not the
// grammar of the values outside usage; the usage value itself is then read
// by the same code as a whole body's, which checks it fully. The zero
// value is ready to use.
type usageScanner struct {
	stack   []byte // open containers: '{' or '['
	stackA  [32]byte
	inStr   bool
	esc     bool
	st      uint8 // in the top-level object: stKey, stColon or stValue
	key     [40]byte
	keyN    int  // bytes of key kept; > len(key) means too long to match
	inKey   bool // reading a top-level member name
	capture bool // reading the top-level usage member's value
	val     []byte
	found   bool // a usage member was read (val holds it)
	long    bool // the last usage value passed maxUsageBytes
	done    bool // the top-level value closed
	bad     bool
}

const (
	stKey = iota
	stColon
	stValue
)

// maxScanDepth is encoding/json's nesting limit.
const maxScanDepth = 10000

var usageName = []string{"usage"}

// feed scans the next piece of the body.
func (s *usageScanner) feed(p []byte) {
	if s.bad {
		return
	}
	if s.stack == nil {
		s.stack = s.stackA[:0]
	}
	start := 0 // of the bytes to capture in p
	for i := 0; i < len(p); i++ {
		if s.inStr {
			if s.esc {
				s.esc = false
				s.keyByte(p[i])
				continue
			}
			// Jump to the next quote or backslash: most of a body is
			// the text of long strings.
			rest := p[i:]
			j := bytes.IndexByte(rest, '"')
			if j < 0 {
				j = len(rest)
			}
			if k := bytes.IndexByte(rest[:j], '\\'); k >= 0 {
				j = k
			}
			if s.inKey {
				for _, c := range rest[:j] {
					s.keyByte(c)
				}
			}
			i += j
			if i == len(p) {
				break
			}
			c := p[i]
			s.keyByte(c)
			if c == '\\' {
				s.esc = true
				continue
			}
			s.inStr = false
			if s.inKey {
				s.inKey, s.st = false, stColon
			}
			continue
		}
		c := p[i]
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		case '"':
			if len(s.stack) == 0 {
				s.bad = true
				return
			}
			s.inStr = true
			if len(s.stack) == 1 && s.st == stKey {
				s.inKey, s.keyN = true, 0
				s.keyByte(c)
			}
		case '{', '[':
			if len(s.stack) == 0 && (s.done || c != '{') {
				s.bad = true // a second value, or not an object
				return
			}
			if len(s.stack) >= maxScanDepth {
				s.bad = true
				return
			}
			s.stack = append(s.stack, c)
			if len(s.stack) == 1 {
				s.st = stKey
			}
		case '}', ']':
			n := len(s.stack)
			if n == 0 || s.stack[n-1] != c-2 { // '{'+2 == '}', '['+2 == ']'
				s.bad = true
				return
			}
			if n == 1 {
				if s.capture {
					s.capture = false
					s.val = s.appendVal(s.val, p[start:i])
				}
				s.done = true
			}
			s.stack = s.stack[:n-1]
		case ',':
			if len(s.stack) == 1 {
				if s.capture {
					s.capture = false
					s.val = s.appendVal(s.val, p[start:i])
				}
				s.st = stKey
			}
		case ':':
			if len(s.stack) == 1 && s.st == stColon {
				s.st = stValue
				if s.keyN <= len(s.key) {
					if exact, _ := fieldIndex(s.key[:s.keyN], usageName); exact == 0 {
						s.capture, s.found, s.long = true, true, false
						s.val = s.val[:0]
						start = i + 1
					}
				}
			}
		default:
			if len(s.stack) == 0 {
				s.bad = true // a scalar at the top, or bytes after the object
				return
			}
		}
	}
	if s.capture {
		s.val = s.appendVal(s.val, p[start:])
	}
}

// keyByte keeps one byte of a top-level member name being read.
func (s *usageScanner) keyByte(c byte) {
	if !s.inKey {
		return
	}
	if s.keyN < len(s.key) {
		s.key[s.keyN] = c
	}
	s.keyN++
}

// appendVal adds captured bytes of the usage value, within maxUsageBytes.
func (s *usageScanner) appendVal(val, p []byte) []byte {
	if s.long {
		return val
	}
	if len(val)+len(p) > maxUsageBytes {
		s.long = true
		return val[:0]
	}
	return append(val, p...)
}

// usage ends the scan. It returns the object {"usage":<value>} for the
// dialect's usage reader when the body was one well-formed object with a
// top-level usage member (the last one) of at most maxUsageBytes.
func (s *usageScanner) usage() ([]byte, bool) {
	if s.bad || !s.done || s.inStr || !s.found || s.long {
		return nil, false
	}
	b := make([]byte, 0, len(s.val)+10)
	b = append(b, `{"usage":`...)
	b = append(b, bytes.TrimSpace(s.val)...)
	return append(b, '}'), true
}
