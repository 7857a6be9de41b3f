package listen

import (
	"bytes"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/quic-go/qpack"
	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	"github.com/quic-go/quic-go/quicvarint"
	"golang.org/x/net/http/httpguts"
)

// A streamed HTTP/3 response written by Sluice instead of quic-go's
// response writer: quic-go v0.65.0 (http3/response_writer.go,
// stream.go) writes each DATA frame's header and payload with two stream
// writes, each of which signals the connection's run loop; an event of a
// streamed answer is one frame, so h3Writer takes the stream over
// (http3.HTTPStreamer) at the response's first flush and writes each
// frame, header and payload, with one write — the response's HEADERS
// frame travels in the same write as the first event. At the handler's
// end it writes the trailer's HEADERS frame (encoded with qpack as
// quic-go does) and closes the stream. Responses that are not flushed
// (whole answers, 425 Too Early, HEAD) go through quic-go's writer
// unchanged. See docs/ARCHITECTURE.md, "Event loop" ("HTTP/3 streams").

// H3StreamEnv names the environment variable that leaves every HTTP/3
// response to quic-go's writer ("0"): no take-over, no event loops for
// HTTP/3 streams (for measuring both).
const H3StreamEnv = "SLUICE_H3_STREAM"

var h3TakeOver = os.Getenv(H3StreamEnv) != "0"

// maxHeld bounds what h3Writer holds before the first flush (quic-go's own
// small-response buffer is 4 KiB): more goes through quic-go's writer.
const maxHeld = 4 << 10

// h3Writer is the http.ResponseWriter of an HTTP/3 request; see above.
// Until the first flush it only records the status and holds the body.
type h3Writer struct {
	rw     http.ResponseWriter // quic-go's
	status int                 // a final status given, not yet passed on
	held   []byte
	isHead bool
	// through: everything goes to rw (a response not taken over).
	through bool
	// str is the stream once taken over; qs its QUIC stream, written
	// raw (frames built here).
	str   *http3.Stream
	qs    *quic.Stream
	frame []byte
	err   error // a write failed: the stream is reset at the end
	// loop: an event loop owns the stream (DetachH3); the handler's end
	// leaves it alone.
	loop bool
}

// h3Handler wraps the HTTP/3 server's handler with h3Writer.
func h3Handler(next http.Handler) http.Handler {
	if !h3TakeOver {
		return next
	}
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w := &h3Writer{rw: rw, isHead: r.Method == http.MethodHead}
		ok := false
		defer func() {
			if !ok && w.str != nil && !w.loop {
				// A panic (http.ErrAbortHandler cuts a response): quic-go
				// leaves a taken-over stream alone.
				w.str.CancelRead(quic.StreamErrorCode(http3.ErrCodeInternalError))
				w.str.CancelWrite(quic.StreamErrorCode(http3.ErrCodeInternalError))
			}
		}()
		next.ServeHTTP(w, r)
		ok = true
		w.finish()
	})
}

func (w *h3Writer) Header() http.Header { return w.rw.Header() }

// Unwrap gives http.ResponseController quic-go's writer (deadlines).
func (w *h3Writer) Unwrap() http.ResponseWriter { return w.rw }

func (w *h3Writer) WriteHeader(status int) {
	switch {
	case w.through || w.str != nil:
		if w.through {
			w.rw.WriteHeader(status)
		}
	case status < 200:
		w.rw.WriteHeader(status) // informational: sent at once by quic-go
	case w.status == 0:
		w.status = status
	}
}

func (w *h3Writer) Write(p []byte) (int, error) {
	if w.through {
		return w.rw.Write(p)
	}
	if w.str == nil {
		if w.status == 0 {
			w.sniff(p)
			w.status = http.StatusOK
		}
		if len(w.held)+len(p) < maxHeld && !w.isHead && bodyAllowed(w.status) {
			w.held = append(w.held, p...)
			return len(p), nil
		}
		w.passOn()
		return w.rw.Write(p)
	}
	if w.err != nil {
		return 0, w.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	w.frame = appendData(w.frame[:0], p)
	if _, err := w.qs.Write(w.frame); err != nil {
		w.err = err
		return 0, err
	}
	return len(p), nil
}

// sniff sets Content-Type from p when the handler set none (as quic-go
// and net/http do).
func (w *h3Writer) sniff(p []byte) {
	h := w.rw.Header()
	if _, ok := h["Content-Type"]; !ok && h.Get("Content-Encoding") == "" && len(p) > 0 {
		h.Set("Content-Type", http.DetectContentType(p))
	}
}

// passOn gives the response to quic-go's writer: the status and what was
// held.
func (w *h3Writer) passOn() {
	w.through = true
	if w.status != 0 {
		w.rw.WriteHeader(w.status)
	}
	if len(w.held) > 0 {
		w.rw.Write(w.held)
		w.held = nil
	}
}

func (w *h3Writer) Flush() { w.FlushError() }

// FlushError takes the stream over at the first flush of a response that
// may have a body of unknown length: the HEADERS frame and what was held
// leave in one write. Otherwise it flushes quic-go's writer.
func (w *h3Writer) FlushError() error {
	if w.str != nil {
		return w.err
	}
	if !w.through {
		if w.status == 0 {
			w.status = http.StatusOK
		}
		if w.takeOver() {
			return w.err
		}
		w.passOn()
	}
	return http.NewResponseController(w.rw).Flush()
}

// takeOver takes the stream from quic-go's writer and writes the head and
// the held body; false, having changed nothing, when the response must
// stay quic-go's (no body allowed, HEAD, a Content-Length to enforce, no
// HTTPStreamer).
func (w *h3Writer) takeOver() bool {
	h := w.rw.Header()
	if w.isHead || !bodyAllowed(w.status) || h.Get("Content-Length") != "" {
		return false
	}
	hs, ok := w.rw.(http3.HTTPStreamer)
	if !ok {
		return false
	}
	w.sniff(w.held)
	if _, ok := h["Date"]; !ok {
		h.Set("Date", time.Now().UTC().Format(http.TimeFormat))
	}
	head, err := encodeHead(w.status, h)
	if err != nil {
		return false
	}
	str, err := hs.HTTPStream() // no header written by quic-go: WriteHeader never reached it
	if err != nil {
		return false
	}
	w.str, w.qs = str, str.QUICStream()
	w.frame = head
	if len(w.held) > 0 {
		w.frame = appendData(w.frame, w.held)
		w.held = nil
	}
	if _, err := w.qs.Write(w.frame); err != nil {
		w.err = err
	}
	return true
}

// finish ends a taken-over stream when its handler returns (unless a loop
// has it): the trailer's HEADERS frame, then the stream's end; a stream
// whose write failed is reset. A response not taken over is passed on.
func (w *h3Writer) finish() {
	switch {
	case w.loop:
	case w.str == nil:
		if !w.through && (w.status != 0 || len(w.held) > 0) {
			w.passOn()
		}
	case w.err != nil:
		w.str.CancelRead(quic.StreamErrorCode(http3.ErrCodeRequestCanceled))
		w.str.CancelWrite(quic.StreamErrorCode(http3.ErrCodeRequestCanceled))
	default:
		if t := trailerOf(w.rw.Header()); t != nil {
			w.qs.Write(t)
		}
		w.str.CancelRead(quic.StreamErrorCode(http3.ErrCodeNoError)) // no-op when the body was read to EOF
		w.str.Close()
	}
}

// appendData appends an HTTP/3 DATA frame carrying p.
func appendData(b, p []byte) []byte {
	b = quicvarint.Append(b, 0x0)
	b = quicvarint.Append(b, uint64(len(p)))
	return append(b, p...)
}

// appendHeaders appends an HTTP/3 HEADERS frame carrying block.
func appendHeaders(b, block []byte) []byte {
	b = quicvarint.Append(b, 0x1)
	b = quicvarint.Append(b, uint64(len(block)))
	return append(b, block...)
}

// encodeHead is the response's HEADERS frame as quic-go's writer encodes
// it (response_writer.go, encodeHeader): :status, then every field but
// the declared trailers and http.TrailerPrefix keys, names lowercased.
func encodeHead(status int, h http.Header) ([]byte, error) {
	var buf bytes.Buffer
	enc := qpack.NewEncoder(&buf)
	if err := enc.WriteField(qpack.HeaderField{Name: ":status", Value: strconv.Itoa(status)}); err != nil {
		return nil, err
	}
	declared := declaredTrailers(h)
	for k, vv := range h {
		if _, ok := declared[k]; ok || strings.HasPrefix(k, http.TrailerPrefix) {
			continue
		}
		name := strings.ToLower(k)
		for _, v := range vv {
			if err := enc.WriteField(qpack.HeaderField{Name: name, Value: v}); err != nil {
				return nil, err
			}
		}
	}
	return appendHeaders(nil, buf.Bytes()), nil
}

// declaredTrailers are the names the "Trailer" field declares (canonical).
func declaredTrailers(h http.Header) map[string]struct{} {
	var m map[string]struct{}
	for _, v := range h["Trailer"] {
		for _, k := range strings.Split(v, ",") {
			k = http.CanonicalHeaderKey(strings.TrimSpace(k))
			if httpguts.ValidTrailerHeader(k) {
				if m == nil {
					m = map[string]struct{}{}
				}
				m[k] = struct{}{}
			}
		}
	}
	return m
}

// trailerOf is the trailer's HEADERS frame at the handler's end, as
// quic-go's writer would send it (writeTrailers): the declared trailers'
// values and the http.TrailerPrefix keys; nil when there is none.
func trailerOf(h http.Header) []byte {
	t := http.Header{}
	for k := range declaredTrailers(h) {
		if vv, ok := h[k]; ok {
			t[k] = vv
		}
	}
	for k, vv := range h {
		if name, ok := strings.CutPrefix(k, http.TrailerPrefix); ok {
			t[name] = vv
		}
	}
	return encodeTrailer(t)
}

// encodeTrailer encodes t as a HEADERS frame (valid trailer names, with
// values); nil when nothing is left.
func encodeTrailer(t http.Header) []byte {
	var buf bytes.Buffer
	enc := qpack.NewEncoder(&buf)
	n := 0
	for k, vv := range t {
		if len(vv) == 0 || !httpguts.ValidTrailerHeader(k) {
			continue
		}
		name := strings.ToLower(k)
		for _, v := range vv {
			if enc.WriteField(qpack.HeaderField{Name: name, Value: v}) != nil {
				return nil
			}
			n++
		}
	}
	if n == 0 {
		return nil
	}
	return appendHeaders(nil, buf.Bytes())
}
