package listen

import (
	"bufio"
	"context"
	"errors"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
)

// h1Response is the h1 server's ResponseWriter. The header map is the
// handler's own (never cloned): WriteHeader notes the status, and the head
// is built from the map when the response is committed, at the first
// Flush, when the body outgrows h1BufSize, or after the handler returned.
// A response committed after the handler returned has its length known
// and leaves in one write with its body; a streamed one is chunked on
// HTTP/1.1 (close-delimited on HTTP/1.0), each Flush one write.
type h1Response struct {
	c      *h1Conn
	req    *http.Request
	header http.Header
	body   h1Body
	cancel context.CancelCauseFunc
	done   atomic.Bool // the handler returned
	// unbase ends a hijacked request's watch on the server's base (Hijack).
	unbase func() bool

	status        int
	wroteHeader   bool
	committed     bool // the head is built (in c.out or sent)
	hijacked      bool
	chunked       bool
	closeAfter    bool
	wantClose     bool // the request asked for the connection's close
	head          bool // a HEAD request: no body
	is11          bool
	expect        bool // the client waits for 100 Continue
	sentContinue  bool
	bodyErr       bool
	broken        bool // a write failed
	contentLength int64
	written       int64
	trailers      []string // declared in the Trailer header at commit

	reqv  http.Request // the request req points to
	url   url.URL      // its URL, when the fast parser made it
	lbody lengthBody   // its body of declared length (fast parser)
}

var (
	_ http.ResponseWriter = (*h1Response)(nil)
	_ http.Flusher        = (*h1Response)(nil)
	_ http.Hijacker       = (*h1Response)(nil)
)

// Header returns the response's header map; after the handler returned, a
// map of its own (the response's may already be the next response's, see
// h1Conn.finish).
func (w *h1Response) Header() http.Header {
	if w.done.Load() {
		return http.Header{}
	}
	return w.header
}

func (w *h1Response) WriteHeader(code int) {
	if w.hijacked || w.wroteHeader {
		return
	}
	if code < 100 || code > 999 {
		panic("invalid WriteHeader code " + strconv.Itoa(code))
	}
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		w.writeInformational(code)
		return
	}
	w.wroteHeader = true
	w.status = code
	if cl := w.header["Content-Length"]; len(cl) > 0 {
		if n, err := strconv.ParseInt(cl[0], 10, 64); err == nil && n >= 0 {
			w.contentLength = n
		} else {
			delete(w.header, "Content-Length")
		}
	}
}

// writeInformational sends a 1xx head at once (103 Early Hints and the
// like).
func (w *h1Response) writeInformational(code int) {
	if code == http.StatusContinue {
		if w.sentContinue || !w.expect {
			return
		}
		w.sentContinue = true
	}
	b := w.c.out[:0]
	b = appendStatus(b, true, code)
	b = AppendHeader(b, w.header)
	b = append(b, "\r\n"...)
	w.c.out = b
	w.flushOut()
}

func (w *h1Response) bodyAllowed() bool {
	return !(w.status >= 100 && w.status <= 199 || w.status == http.StatusNoContent || w.status == http.StatusNotModified)
}

func (w *h1Response) Write(p []byte) (int, error) {
	if w.hijacked {
		return 0, http.ErrHijacked
	}
	if w.done.Load() {
		return 0, errors.New("http: write after the handler returned")
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if !w.bodyAllowed() {
		return 0, http.ErrBodyNotAllowed
	}
	w.written += int64(len(p))
	if w.contentLength >= 0 && w.written > w.contentLength {
		w.written -= int64(len(p))
		return 0, http.ErrContentLength
	}
	c := w.c
	if w.head {
		if !w.committed && len(c.body) < sniffLen {
			// Kept for the Content-Type sniff only.
			c.body = append(c.body, p[:min(len(p), sniffLen-len(c.body))]...)
		}
		return len(p), nil
	}
	if !w.committed {
		if len(c.body)+len(p) <= h1BufSize {
			c.body = append(c.body, p...)
			return len(p), nil
		}
		w.commit(false, p)
	}
	w.appendBody(p)
	if len(c.out) >= h1BufSize {
		if err := w.flushOut(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

func (w *h1Response) WriteString(s string) (int, error) {
	if !w.committed && !w.hijacked && len(w.c.body)+len(s) <= h1BufSize && w.wroteHeader && !w.done.Load() &&
		w.bodyAllowed() && !w.head && (w.contentLength < 0 || w.written+int64(len(s)) <= w.contentLength) {
		w.c.body = append(w.c.body, s...)
		w.written += int64(len(s))
		return len(s), nil
	}
	return w.Write([]byte(s))
}

// appendBody appends p to the output with the response's framing.
func (w *h1Response) appendBody(p []byte) {
	c := w.c
	if w.chunked {
		c.out = strconv.AppendInt(c.out, int64(len(p)), 16)
		c.out = append(c.out, "\r\n"...)
		c.out = append(c.out, p...)
		c.out = append(c.out, "\r\n"...)
		return
	}
	c.out = append(c.out, p...)
}

// commit builds the head in c.out, followed by the held body. final: the
// handler returned (the length is known). more is the body about to be
// written (for the Content-Type sniff). The head is net/http's: the
// handler's fields sorted by name (TrailerPrefix ones and invalid names
// left out), then Date, Content-Length, Content-Type, Connection and
// Transfer-Encoding when the server sets them, in that order.
func (w *h1Response) commit(final bool, more []byte) {
	w.committed = true
	c := w.c
	h := w.header
	var ks [32]string
	keys := ks[:0]
	prefixTrailers := false
	for k := range h {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			prefixTrailers = true
			continue
		}
		keys = append(keys, k)
	}
	// Declared trailers set before the commit stay out of the head: the
	// head is built from the live map, not from a copy taken at
	// WriteHeader as net/http's is, and a handler sets them after its
	// first Write.
	w.trailers = w.trailers[:0]
	for _, v := range h["Trailer"] {
		for _, k := range strings.Split(v, ",") {
			if k = http.CanonicalHeaderKey(strings.TrimSpace(k)); k != "" {
				switch k {
				case "Transfer-Encoding", "Trailer", "Content-Length": // net/http's declareTrailer
				default:
					w.trailers = append(w.trailers, k)
				}
			}
		}
	}
	hasTrailers := prefixTrailers || len(h["Trailer"]) > 0
	te := ""
	if v := h["Transfer-Encoding"]; len(v) > 0 {
		te = v[0]
	}
	setCL := false
	if final && w.contentLength < 0 && !hasTrailers && te == "" && w.bodyAllowed() && !(w.head && w.written == 0) {
		w.contentLength = int64(len(c.body))
		if w.head {
			w.contentLength = w.written // what the GET would have sent
		}
		setCL = true
	}
	suppress := ""
	switch {
	case w.status == http.StatusNotModified:
		suppress = "Content-Type Content-Length Transfer-Encoding"
	case !w.bodyAllowed():
		suppress = "Content-Length Transfer-Encoding"
	}
	switch {
	case w.head || !w.bodyAllowed() || w.status == http.StatusNoContent:
		suppress += " Transfer-Encoding"
	case w.contentLength >= 0:
		if te != "" && te != "identity" {
			suppress += " Content-Length" // net/http ignores the length then
			w.contentLength = -1
			if w.is11 {
				w.chunked = true
				suppress += " Transfer-Encoding"
			} else {
				w.closeAfter = true
			}
		} else {
			suppress += " Transfer-Encoding"
		}
	case w.is11:
		if te == "identity" {
			w.closeAfter = true
			suppress += " Transfer-Encoding"
		} else {
			w.chunked = true
			suppress += " Transfer-Encoding"
		}
	default:
		w.closeAfter = true // HTTP/1.0: the body ends with the connection
		suppress += " Transfer-Encoding"
	}
	if w.chunked {
		suppress += " Content-Length"
	}
	if w.wantClose || w.c.srv.shutting.Load() || hasToken(h["Connection"], "close") {
		w.closeAfter = true
	}
	keep10 := false
	if !w.is11 && !w.closeAfter {
		if hasToken(w.req.Header["Connection"], "keep-alive") && (w.head || w.contentLength >= 0 || !w.bodyAllowed()) {
			keep10 = true
		} else {
			w.closeAfter = true
		}
	}
	if w.expect && !w.sentContinue && !w.body.eof.Load() {
		// The client may still send the body it was not asked for.
		w.closeAfter = true
	}
	connection := ""
	switch {
	case w.closeAfter && !hasToken(h["Connection"], "close") && w.status != http.StatusSwitchingProtocols:
		suppress += " Connection"
		if w.is11 {
			connection = "close"
		}
	case keep10 && len(h["Connection"]) == 0:
		connection = "keep-alive"
	}
	slices.Sort(keys)
	b := c.out[:0]
	b = appendStatus(b, w.is11, w.status)
	for _, k := range keys {
		if suppress != "" && excluded(suppress, k) || len(w.trailers) > 0 && slices.Contains(w.trailers, k) || !httpguts.ValidHeaderFieldName(k) {
			continue
		}
		for _, v := range h[k] {
			b = appendField(b, k, v)
		}
	}
	if _, ok := h["Date"]; !ok {
		b = append(b, "Date: "...)
		b = c.appendDate(b)
		b = append(b, "\r\n"...)
	}
	if setCL {
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, w.contentLength, 10)
		b = append(b, "\r\n"...)
	}
	if _, ok := h["Content-Type"]; !ok && w.bodyAllowed() && te == "" && len(h["Content-Encoding"]) == 0 {
		sniff := c.body
		if len(sniff) == 0 {
			sniff = more
		}
		if len(sniff) > 0 {
			b = append(b, "Content-Type: "...)
			b = append(b, http.DetectContentType(sniff)...)
			b = append(b, "\r\n"...)
		}
	}
	if connection != "" {
		b = append(b, "Connection: "...)
		b = append(b, connection...)
		b = append(b, "\r\n"...)
	}
	if w.chunked {
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	}
	b = append(b, "\r\n"...)
	c.out = b
	if w.head {
		c.body = c.body[:0]
	} else if len(c.body) > 0 {
		body := c.body
		c.body = c.body[:0]
		w.appendBody(body)
	}
}

// excluded reports whether k is one of the space-separated names in set.
func excluded(set, k string) bool {
	for set != "" {
		var name string
		name, set, _ = strings.Cut(set, " ")
		if name == k {
			return true
		}
	}
	return false
}

// sniffLen is how much of a body http.DetectContentType reads.
const sniffLen = 512

func hasToken(vv []string, tok string) bool {
	for _, v := range vv {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), tok) {
				return true
			}
		}
	}
	return false
}

func appendStatus(b []byte, is11 bool, code int) []byte {
	if is11 {
		if code == http.StatusOK {
			return append(b, "HTTP/1.1 200 OK\r\n"...)
		}
		b = append(b, "HTTP/1.1 "...)
	} else {
		b = append(b, "HTTP/1.0 "...)
	}
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, ' ')
	text := http.StatusText(code)
	if text == "" {
		text = "status code " + strconv.Itoa(code)
	}
	b = append(b, text...)
	return append(b, "\r\n"...)
}

// AppendHeader appends h's fields as header lines sorted by name, as
// net/http's Header.Write writes them (invalid names left out, line breaks
// in a value made spaces, values trimmed) but without its pooled sorter and
// string replacer: for the 1xx heads, and for the head the h1 hand-off to
// the event loops writes (proxy's appendHead).
func AppendHeader(b []byte, h http.Header) []byte {
	var ks [32]string
	keys := ks[:0]
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !httpguts.ValidHeaderFieldName(k) {
			continue
		}
		for _, v := range h[k] {
			b = appendField(b, k, v)
		}
	}
	return b
}

// appendField appends one header or trailer line.
func appendField(b []byte, name, v string) []byte {
	b = append(b, name...)
	b = append(b, ": "...)
	b = appendValue(b, v)
	return append(b, "\r\n"...)
}

// appendValue appends v with its line breaks made spaces, then trimmed of
// ASCII white space (net/http's headerNewlineToSpace and
// textproto.TrimString).
func appendValue(b []byte, v string) []byte {
	i, j := 0, len(v)
	for i < j && asciiSpace(v[i]) {
		i++
	}
	for j > i && asciiSpace(v[j-1]) {
		j--
	}
	for ; i < j; i++ {
		if c := v[i]; c == '\r' || c == '\n' {
			b = append(b, ' ')
		} else {
			b = append(b, c)
		}
	}
	return b
}

func asciiSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// flushOut writes c.out to the socket.
func (w *h1Response) flushOut() error {
	c := w.c
	if len(c.out) == 0 {
		return nil
	}
	if w.broken {
		c.out = c.out[:0]
		return net.ErrClosed
	}
	var err error
	if c.sock != nil {
		_, err = c.sock.Write(c.out)
	} else {
		_, err = c.rwc.Write(c.out)
	}
	c.out = c.out[:0]
	if err != nil {
		w.broken = true
		w.closeAfter = true
	}
	return err
}

func (w *h1Response) FlushError() error {
	if w.hijacked {
		return http.ErrHijacked
	}
	if w.done.Load() {
		return errors.New("http: flush after the handler returned")
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.committed {
		w.commit(false, nil)
	}
	return w.flushOut()
}

func (w *h1Response) Flush() { w.FlushError() }

// finishResponse writes what remains of the response after the handler
// returned and reports whether the connection may serve another request.
func (w *h1Response) finishResponse() bool {
	c := w.c
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.committed {
		// A body the handler left unread is drained (bounded) before the
		// head, so that the head can say whether the connection stays.
		if !w.body.eof.Load() && !w.body.drain() {
			w.closeAfter = true
		}
		w.commit(true, nil)
	} else if !w.body.eof.Load() && !w.closeAfter && !w.body.drain() {
		w.closeAfter = true
	}
	if w.chunked {
		c.out = append(c.out, "0\r\n"...)
		c.out = w.appendTrailers(c.out)
		c.out = append(c.out, "\r\n"...)
	}
	if w.contentLength >= 0 && w.written != w.contentLength && !w.head && w.bodyAllowed() {
		w.closeAfter = true // the client waits for bytes that never come
	}
	w.flushOut()
	if cap(c.body) > h1BufSize {
		c.body = nil
	}
	if cap(c.out) > 4*h1BufSize {
		c.out = nil
	}
	return !w.closeAfter && !w.broken
}

// appendTrailers appends the trailer fields as net/http sends them: the
// TrailerPrefix ones (names as given) and the declared ones, sorted by
// name.
func (w *h1Response) appendTrailers(b []byte) []byte {
	h := w.header
	var ks [16]string
	keys := append(ks[:0], w.trailers...)
	for k := range h {
		if name, ok := strings.CutPrefix(k, http.TrailerPrefix); ok && !slices.Contains(w.trailers, name) {
			keys = append(keys, name)
		}
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	for _, k := range keys {
		if !httpguts.ValidHeaderFieldName(k) {
			continue
		}
		for _, v := range h[http.TrailerPrefix+k] {
			b = appendField(b, k, v)
		}
		if slices.Contains(w.trailers, k) {
			for _, v := range h[k] {
				b = appendField(b, k, v)
			}
		}
	}
	return b
}

// Hijack hands the connection to the handler: the watcher stops (what it
// read stays in the returned reader), what the response committed is sent
// first, and the server forgets the connection.
func (w *h1Response) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.hijacked {
		return nil, nil, http.ErrHijacked
	}
	if w.done.Load() {
		return nil, nil, errors.New("http: Hijack after the handler returned")
	}
	c := w.c
	c.stopWatch()
	c.lr.remain, c.armed = math.MaxInt64, false // a watcher may have armed the head's limit
	if w.committed {
		w.flushOut()
	}
	w.hijacked = true
	c.srv.forget(c)
	// Forgotten, the request is no longer one stopRequests cancels: it
	// watches the base itself until its handler returns (a WebSocket's
	// runs as long as its socket).
	base := c.srv.s.base
	w.unbase = context.AfterFunc(base, func() { w.cancel(context.Cause(base)) })
	size := 64
	if len(w.req.Header["Upgrade"]) > 0 {
		size = h1BufSize // a WebSocket library writes through it
	}
	br := c.br
	c.br = nil // the handler's now
	return c.rwc, bufio.NewReadWriter(br, bufio.NewWriterSize(c.rwc, size)), nil
}

// The http.ResponseController hooks.

func (w *h1Response) SetReadDeadline(t time.Time) error  { return w.c.setReadDeadline(t, false) }
func (w *h1Response) SetWriteDeadline(t time.Time) error { return w.c.rwc.SetWriteDeadline(t) }
func (w *h1Response) EnableFullDuplex() error            { return nil }
