package listen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sluice-proxy/sluice/proxy/evloop"
)

// h2stream is one request and its response: the handler's
// http.ResponseWriter (also an http.Flusher and what
// http.ResponseController needs) and, in body, the request's body.
type h2stream struct {
	c      *h2conn
	id     uint32
	ctx    context.Context
	cancel context.CancelCauseFunc
	req    *http.Request
	body   *h2body
	head   bool // HEAD: no body is sent

	// Guarded by c.mu.
	sendWin     int64
	recvWin     int64 // the client's credit on this stream
	unacked     int64 // consumed request bytes not yet given back
	remoteEnded bool  // the client's END_STREAM arrived
	reset       bool  // RST_STREAM sent or received, or the connection ended
	resetErr    error
	wdeadline   bool // the write deadline passed
	wtimer      *time.Timer
	stop        func() bool // ends the AfterFunc that wakes waits on ctx
	// The event loop's (h2loop.go): the stream was handed to a loop
	// (its handler returns without ending it), the loop's waker, the
	// stream waits in c.blocked for credit, the trailer for its end.
	loop     bool
	waker    evloop.Waker
	blocked  bool
	retired  bool // removed from c.streams
	ltrailer []hpack.HeaderField

	// The handler's goroutine's own.
	header      http.Header
	status      int
	wroteHeader bool
	sentHeader  bool
	ended       bool // END_STREAM sent
	out         []byte
	outOff      int
}

var (
	_ http.ResponseWriter = (*h2stream)(nil)
	_ http.Flusher        = (*h2stream)(nil)
	_ io.StringWriter     = (*h2stream)(nil)
)

// headerBlock is the header block being read (HEADERS, then
// CONTINUATION frames) and its decoded fields.
type headerBlock struct {
	c         *h2conn
	open      bool
	id        uint32
	endStream bool
	trailer   bool // the trailers of an open stream
	frames    int
	size      int
	listSize  uint32
	tooBig    bool
	fields    []hpack.HeaderField
}

func (hb *headerBlock) emit(f hpack.HeaderField) {
	hb.listSize += f.Size()
	if hb.listSize > hb.c.lim.maxHeaderList {
		hb.tooBig = true
		return
	}
	hb.fields = append(hb.fields, f)
}

func (c *h2conn) onHeaders(f *http2.HeadersFrame) error {
	id := f.StreamID
	if id%2 == 0 {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	c.hb = headerBlock{c: c, open: true, id: id, endStream: f.StreamEnded(), fields: c.hb.fields[:0]}
	if id <= c.maxSeen {
		// Trailers, or a header block for a stream that ended on the
		// server's side (decoded for HPACK's state, then dropped).
		c.mu.Lock()
		st := c.streams[id]
		ended := st != nil && st.remoteEnded
		c.mu.Unlock()
		if ended {
			return http2.ConnectionError(http2.ErrCodeStreamClosed)
		}
		if st != nil && !f.StreamEnded() {
			return http2.ConnectionError(http2.ErrCodeProtocol)
		}
		c.hb.trailer = true
	} else {
		c.mu.Lock() // goAway reads it on other goroutines
		c.maxSeen = id
		c.mu.Unlock()
	}
	if !f.HeadersEnded() && c.lim.readHeader > 0 {
		c.nc.SetReadDeadline(time.Now().Add(c.lim.readHeader))
	}
	return c.headerFragment(f.HeaderBlockFragment(), f.HeadersEnded())
}

func (c *h2conn) onContinuation(f *http2.ContinuationFrame) error {
	return c.headerFragment(f.HeaderBlockFragment(), f.HeadersEnded())
}

// headerFragment decodes one fragment of the header block; the last one
// opens the stream (or ends the request body, for trailers).
func (c *h2conn) headerFragment(p []byte, end bool) error {
	hb := &c.hb
	hb.frames++
	hb.size += len(p)
	if hb.frames > c.lim.maxHeaderFrames || hb.size > c.lim.maxHeaderBlock {
		return http2.ConnectionError(http2.ErrCodeEnhanceYourCalm)
	}
	if _, err := c.dec.Write(p); err != nil {
		return http2.ConnectionError(http2.ErrCodeCompression)
	}
	if !end {
		return nil
	}
	hb.open = false
	if err := c.dec.Close(); err != nil {
		return http2.ConnectionError(http2.ErrCodeCompression)
	}
	if hb.frames > 1 && c.lim.readHeader > 0 {
		c.mu.Lock()
		if !c.goingAway {
			c.nc.SetReadDeadline(time.Time{})
		}
		c.mu.Unlock()
	}
	if hb.trailer {
		c.endBody(hb.id) // request trailers are read and dropped
		return nil
	}
	c.openStream()
	return nil
}

// endBody ends a request body at the client's END_STREAM.
func (c *h2conn) endBody(id uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.streams[id]
	if st == nil {
		return
	}
	st.remoteEnded = true
	b := st.body
	if b != nil {
		if b.want >= 0 && b.got != b.want {
			b.err = errors.New("http2: request body shorter than its content-length")
		}
		b.eof = true
		b.cond.Signal()
	}
}

// openStream starts the request of a complete header block, or refuses
// it.
func (c *h2conn) openStream() {
	hb := &c.hb
	c.mu.Lock()
	if c.closed || c.goingAway && hb.id > c.lastID || len(c.streams) >= c.lim.maxStreams {
		c.w.fr.WriteRSTStream(hb.id, http2.ErrCodeRefusedStream)
		c.flushLocked()
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	if hb.tooBig {
		c.answer(hb.id, http.StatusRequestHeaderFieldsTooLarge)
		return
	}
	st, err := c.newStream(hb)
	if err != nil {
		c.mu.Lock()
		c.w.fr.WriteRSTStream(hb.id, http2.ErrCodeProtocol)
		c.flushLocked()
		c.mu.Unlock()
		return
	}
	c.mu.Lock()
	st.sendWin = c.initSend
	st.recvWin = int64(c.lim.streamWindow)
	st.remoteEnded = hb.endStream
	c.streams[st.id] = st
	if len(c.streams) == 1 {
		c.idleTimer.Stop()
		c.armStallLocked()
	}
	c.mu.Unlock()
	go c.runHandler(st)
}

// answer sends a whole bodiless response without running the handler.
func (c *h2conn) answer(id uint32, status int) {
	c.mu.Lock()
	c.w.hbuf.Reset()
	c.w.field(":status", strconv.Itoa(status))
	c.w.field("content-length", "0")
	c.headerBlockLocked(id, true)
	c.flushLocked()
	c.mu.Unlock()
}

// connection-specific request headers are malformed on HTTP/2.
var badRequestHeaders = map[string]bool{
	"connection": true, "keep-alive": true, "proxy-connection": true, "transfer-encoding": true, "upgrade": true,
}

// newStream builds the request of a header block.
func (c *h2conn) newStream(hb *headerBlock) (*h2stream, error) {
	var method, path, scheme, authority string
	n := 0
	for _, f := range hb.fields {
		if !f.IsPseudo() {
			n++
		}
	}
	h := make(http.Header, n)
	vals := make([]string, n)
	var cookies []string
	for _, f := range hb.fields {
		if f.IsPseudo() {
			switch f.Name {
			case ":method":
				method = f.Value
			case ":path":
				path = f.Value
			case ":scheme":
				scheme = f.Value
			case ":authority":
				authority = f.Value
			default:
				return nil, errors.New("unknown pseudo-header")
			}
			continue
		}
		if badRequestHeaders[f.Name] || !httpguts.ValidHeaderFieldName(f.Name) || hasUpper(f.Name) ||
			!httpguts.ValidHeaderFieldValue(f.Value) || f.Name == "te" && f.Value != "trailers" {
			return nil, errors.New("malformed header")
		}
		if f.Name == "cookie" {
			cookies = append(cookies, f.Value)
			continue
		}
		k := textproto.CanonicalMIMEHeaderKey(f.Name)
		if vv, ok := h[k]; ok {
			h[k] = append(vv, f.Value)
		} else {
			vals[0] = f.Value
			h[k], vals = vals[:1:1], vals[1:]
		}
	}
	if len(cookies) > 0 {
		h["Cookie"] = []string{strings.Join(cookies, "; ")}
	}
	if method == "" || path == "" || scheme == "" || method == http.MethodConnect {
		return nil, errors.New("missing pseudo-header")
	}
	u, err := url.ParseRequestURI(path)
	if err != nil {
		return nil, err
	}
	if authority == "" {
		authority = h.Get("Host")
	}
	ctx, cancel := context.WithCancelCause(c.base)
	st := &h2stream{c: c, id: hb.id, ctx: ctx, cancel: cancel, header: make(http.Header), head: method == http.MethodHead}
	req := &http.Request{Method: method, URL: u, Proto: "HTTP/2.0", ProtoMajor: 2, Header: h, Host: authority,
		RequestURI: path, RemoteAddr: c.remote, TLS: c.tlsState, Body: http.NoBody}
	if !hb.endStream {
		b := &h2body{st: st, want: -1}
		b.cond.L = &c.mu
		if cl := h.Get("Content-Length"); cl != "" {
			v, err := strconv.ParseInt(cl, 10, 64)
			if err != nil || v < 0 {
				cancel(nil)
				return nil, errors.New("bad content-length")
			}
			b.want = v
		}
		b.expect = strings.EqualFold(h.Get("Expect"), "100-continue")
		req.ContentLength = b.want
		req.Body = b
		st.body = b
	}
	st.req = req.WithContext(ctx)
	return st, nil
}

func hasUpper(s string) bool {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			return true
		}
	}
	return false
}

// onData takes a DATA frame into its stream's request body.
func (c *h2conn) onData(f *http2.DataFrame) error {
	n := int64(f.Length)
	c.mu.Lock()
	defer c.mu.Unlock()
	if n > c.recvConn {
		return http2.ConnectionError(http2.ErrCodeFlowControl)
	}
	c.recvConn -= n
	st := c.streams[f.StreamID]
	if st == nil || st.remoteEnded || st.body == nil || st.body.closed || st.reset {
		// Closed, reset or unknown: the bytes go back to the connection.
		c.unackedConn += n
		c.giveBackLocked(nil)
		if f.StreamID > c.maxSeen {
			return http2.ConnectionError(http2.ErrCodeProtocol)
		}
		if st != nil && st.remoteEnded {
			c.resetLocked(st, http2.ErrCodeStreamClosed)
			c.flushLocked()
		}
		return nil
	}
	if n > st.recvWin {
		c.resetLocked(st, http2.ErrCodeFlowControl)
		c.flushLocked()
		return nil
	}
	st.recvWin -= n
	data := f.Data()
	b := st.body
	if pad := n - int64(len(data)); pad > 0 {
		st.unacked += pad
		c.unackedConn += pad
		c.giveBackLocked(st)
	}
	b.got += int64(len(data))
	if b.want >= 0 && b.got > b.want {
		c.resetLocked(st, http2.ErrCodeProtocol)
		c.flushLocked()
		return nil
	}
	b.buf = append(b.buf, data...)
	if f.StreamEnded() {
		st.remoteEnded = true
		if b.want >= 0 && b.got != b.want {
			b.err = errors.New("http2: request body shorter than its content-length")
		}
		b.eof = true
	}
	b.cond.Signal()
	return nil
}

// giveBackLocked sends WINDOW_UPDATE frames for consumed request bytes
// once half a window has been consumed (st may be nil: the connection's
// only).
func (c *h2conn) giveBackLocked(st *h2stream) {
	wrote := false
	if st != nil && !st.remoteEnded && st.unacked >= int64(c.lim.streamWindow/2) {
		c.w.fr.WriteWindowUpdate(st.id, uint32(st.unacked))
		st.recvWin += st.unacked
		st.unacked = 0
		wrote = true
	}
	if c.unackedConn >= int64(c.lim.connWindow/2) {
		c.w.fr.WriteWindowUpdate(0, uint32(c.unackedConn))
		c.recvConn += c.unackedConn
		c.unackedConn = 0
		wrote = true
	}
	if wrote {
		c.flushLocked()
	}
}

// resetLocked resets st from the server's side.
func (c *h2conn) resetLocked(st *h2stream, code http2.ErrCode) {
	if !st.reset {
		c.w.fr.WriteRSTStream(st.id, code)
	}
	st.peerReset(errStreamReset)
}

// peerReset ends st (c.mu held): the handler's context is cancelled,
// its writes and body reads fail.
func (st *h2stream) peerReset(err error) {
	if st.reset {
		return
	}
	st.reset = true
	st.resetErr = err
	st.cancel(nil)
	if st.waker != nil {
		st.waker.Gone() // a stream on a loop: the loop ends it
	}
	if st.body != nil {
		if st.body.err == nil {
			st.body.err = err
		}
		st.body.cond.Signal()
	}
	st.c.cond.Broadcast()
}

// runHandler serves one stream on its own goroutine.
func (c *h2conn) runHandler(st *h2stream) {
	defer st.done()
	c.handler.ServeHTTP(st, st.req)
}

// done ends the stream after its handler returned: the rest of the
// response and END_STREAM go out (a panic resets the stream instead).
func (st *h2stream) done() {
	c := st.c
	rec := recover()
	if rec != nil && rec != http.ErrAbortHandler {
		buf := make([]byte, 16<<10)
		buf = buf[:runtime.Stack(buf, false)]
		c.srv.log.Error("http2: panic serving request", "remote", c.remote, "panic", fmt.Sprint(rec), "stack", string(buf))
	}
	if rec == nil {
		c.mu.Lock()
		loop := st.loop
		c.mu.Unlock()
		if loop {
			return // an event loop relays the stream and ends it (h2loop.go)
		}
		st.send(true)
	}
	c.mu.Lock()
	if st.retired {
		c.mu.Unlock()
		return
	}
	if rec != nil {
		c.resetLocked(st, http2.ErrCodeInternal)
	} else if !st.remoteEnded && !st.reset {
		// The response is complete; the client need not send the rest.
		c.w.fr.WriteRSTStream(st.id, http2.ErrCodeNo)
	}
	st.retireLocked()
	c.giveBackLocked(nil)
	c.flushLocked()
	c.mu.Unlock()
	st.cancel(nil)
}

// retireLocked removes an ended stream from its connection: its unread
// request body goes back to the connection's window (given back by the
// caller), its timers stop, and a connection left without streams starts
// its idle or closing countdown.
func (st *h2stream) retireLocked() {
	c := st.c
	st.retired = true
	if b := st.body; b != nil && len(b.buf) > b.off {
		c.unackedConn += int64(len(b.buf) - b.off)
		b.buf, b.off = nil, 0
	}
	if st.body != nil {
		st.body.closed = true
	}
	delete(c.streams, st.id)
	if st.stop != nil {
		st.stop()
	}
	if st.wtimer != nil {
		st.wtimer.Stop()
	}
	if st.blocked {
		c.unblockLocked(st)
	}
	if len(c.streams) == 0 && !c.closed {
		if c.goingAway {
			c.closeSoonLocked()
		} else if c.lim.idle > 0 {
			c.idleTimer.Reset(c.lim.idle)
		}
	}
}

// Header returns the response header.
func (st *h2stream) Header() http.Header { return st.header }

// WriteHeader sets the status; 1xx (but 101) are sent at once.
func (st *h2stream) WriteHeader(code int) {
	if st.wroteHeader || code < 100 || code > 999 {
		return
	}
	if code < 200 {
		if code != http.StatusSwitchingProtocols {
			st.informational(code)
		}
		return
	}
	st.wroteHeader = true
	st.status = code
}

func (st *h2stream) informational(code int) {
	c := st.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.reset || c.closed {
		return
	}
	c.w.hbuf.Reset()
	c.w.field(":status", strconv.Itoa(code))
	c.w.headerFields(st.header)
	c.headerBlockLocked(st.id, false)
	c.flushLocked()
}

// Write adds p to the response body; it is sent at the next Flush, when
// 16 KiB are waiting, or when the handler returns.
func (st *h2stream) Write(p []byte) (int, error) {
	if !st.wroteHeader {
		st.WriteHeader(http.StatusOK)
	}
	if st.head || !bodyAllowed(st.status) {
		return len(p), nil
	}
	st.out = append(st.out, p...)
	if len(st.out)-st.outOff >= 16<<10 {
		if err := st.send(false); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// WriteString is Write for a string.
func (st *h2stream) WriteString(s string) (int, error) {
	if !st.wroteHeader {
		st.WriteHeader(http.StatusOK)
	}
	if st.head || !bodyAllowed(st.status) {
		return len(s), nil
	}
	st.out = append(st.out, s...)
	if len(st.out)-st.outOff >= 16<<10 {
		if err := st.send(false); err != nil {
			return 0, err
		}
	}
	return len(s), nil
}

// Flush sends the header (if not yet sent) and the written body.
func (st *h2stream) Flush() { st.FlushError() }

// FlushError is Flush with its error (for http.ResponseController).
func (st *h2stream) FlushError() error {
	if !st.wroteHeader {
		st.WriteHeader(http.StatusOK)
	}
	return st.send(false)
}

// EnableFullDuplex does nothing: HTTP/2 reads and writes independently.
func (st *h2stream) EnableFullDuplex() error { return nil }

// SetReadDeadline bounds the reads of the request body.
func (st *h2stream) SetReadDeadline(t time.Time) error {
	if st.body != nil {
		st.body.setDeadline(t)
	}
	return nil
}

// SetWriteDeadline makes the response's writes fail past t (zero: no
// deadline).
func (st *h2stream) SetWriteDeadline(t time.Time) error {
	c := st.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.wtimer != nil {
		st.wtimer.Stop()
	}
	st.wdeadline = false
	if t.IsZero() {
		return nil
	}
	d := time.Until(t)
	if d <= 0 {
		st.wdeadline = true
		return nil
	}
	st.wtimer = time.AfterFunc(d, func() {
		c.mu.Lock()
		st.wdeadline = true
		c.cond.Broadcast()
		c.mu.Unlock()
	})
	return nil
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// writeErrLocked is why st can no longer write, or nil.
func (st *h2stream) writeErrLocked() error {
	c := st.c
	switch {
	case c.w.err != nil:
		return errH2ClientGone
	case st.reset:
		return st.resetErr
	case c.closed:
		return errH2ClientGone
	case st.wdeadline:
		return os.ErrDeadlineExceeded
	}
	return nil
}

// send frames the header (if not sent) and the written body into the
// connection's buffer and writes it out; final adds the trailers and
// END_STREAM.
func (st *h2stream) send(final bool) error {
	if st.ended {
		return nil
	}
	c := st.c
	var trailers []hpack.HeaderField
	if final {
		if !st.wroteHeader {
			st.WriteHeader(http.StatusOK)
		}
		trailers = st.trailers()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := st.writeErrLocked(); err != nil {
		return err
	}
	if !st.sentHeader {
		end := final && len(st.out) == st.outOff && trailers == nil
		st.headerLocked(end, final && trailers == nil)
		st.sentHeader = true
		if end {
			st.ended = true
			return c.flushLocked()
		}
	}
	for st.outOff < len(st.out) {
		n := int64(min(len(st.out)-st.outOff, c.maxFrame))
		n = min(n, st.sendWin, c.sendConn)
		if n <= 0 || len(c.w.buf) >= maxBuffered && c.w.flushing {
			if err := st.waitLocked(); err != nil {
				return err
			}
			continue
		}
		end := final && st.outOff+int(n) == len(st.out) && trailers == nil
		c.w.data(st.id, st.out[st.outOff:st.outOff+int(n)], end)
		st.outOff += int(n)
		st.sendWin -= n
		c.sendConn -= n
		st.ended = end
	}
	st.out, st.outOff = st.out[:0], 0
	if final && !st.ended {
		if trailers != nil {
			c.w.hbuf.Reset()
			for _, f := range trailers {
				c.w.enc.WriteField(f)
			}
			c.headerBlockLocked(st.id, true)
		} else {
			c.w.data(st.id, nil, true)
		}
		st.ended = true
	}
	return c.flushLocked()
}

// waitLocked waits for flow-control credit or buffer space: it writes out
// what is buffered first, and gives up when the stream ends or its
// context is done.
func (st *h2stream) waitLocked() error {
	c := st.c
	c.flushLocked()
	if err := st.writeErrLocked(); err != nil {
		return err
	}
	if err := st.ctx.Err(); err != nil {
		return err
	}
	if len(c.w.buf) < maxBuffered && st.sendWin > 0 && c.sendConn > 0 {
		return nil // room appeared while writing
	}
	if st.stop == nil {
		st.stop = context.AfterFunc(st.ctx, func() {
			c.mu.Lock()
			c.cond.Broadcast()
			c.mu.Unlock()
		})
	}
	c.w.waiting++
	c.cond.Wait()
	c.w.waiting--
	return nil
}

// headerLocked encodes the response header. final: the handler has
// returned and the whole body is in st.out (its length is known).
func (st *h2stream) headerLocked(end, final bool) {
	c := st.c
	w := &c.w
	h := st.header
	w.hbuf.Reset()
	w.field(":status", statusText(st.status))
	w.headerFields(h)
	body := st.out[st.outOff:]
	if bodyAllowed(st.status) {
		if _, ok := h["Content-Type"]; !ok && len(body) > 0 {
			w.field("content-type", http.DetectContentType(body))
		}
		if _, ok := h["Content-Length"]; !ok && final && (len(body) > 0 || !st.head) {
			w.field("content-length", strconv.Itoa(len(body)))
		}
	}
	if _, ok := h["Date"]; !ok {
		w.field("date", time.Now().UTC().Format(http.TimeFormat))
	}
	c.headerBlockLocked(st.id, end)
}

var statusTexts = func() (s [600]string) {
	for i := range s {
		s[i] = strconv.Itoa(i)
	}
	return
}()

func statusText(code int) string {
	if code < len(statusTexts) {
		return statusTexts[code]
	}
	return strconv.Itoa(code)
}

// trailers are the response's trailer fields (http.TrailerPrefix keys
// and the names the Trailer header declared), or nil.
func (st *h2stream) trailers() []hpack.HeaderField {
	var out []hpack.HeaderField
	for k, vv := range st.header {
		name, ok := strings.CutPrefix(k, http.TrailerPrefix)
		if !ok {
			continue
		}
		for _, v := range vv {
			out = append(out, hpack.HeaderField{Name: strings.ToLower(name), Value: v})
		}
	}
	for _, decl := range st.header["Trailer"] {
		for name := range strings.SplitSeq(decl, ",") {
			k := textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(name))
			for _, v := range st.header[k] {
				out = append(out, hpack.HeaderField{Name: strings.ToLower(k), Value: v})
			}
		}
	}
	return out
}

// h2body is a request's body: the DATA the reader received, read by the
// handler; reading gives the client flow-control credit back.
type h2body struct {
	st *h2stream
	// Guarded by st.c.mu.
	buf      []byte
	off      int
	got      int64 // bytes received
	want     int64 // content-length, or -1
	eof      bool
	err      error
	closed   bool
	expect   bool // 100-continue not yet sent
	timedOut bool
	timer    *time.Timer
	cond     sync.Cond
	gen      int // deadline timers set
}

var errBodyClosed = errors.New("http: invalid Read on closed Body")

func (b *h2body) Read(p []byte) (int, error) {
	c := b.st.c
	c.mu.Lock()
	defer c.mu.Unlock()
	for b.off == len(b.buf) {
		switch {
		case b.closed:
			return 0, errBodyClosed
		case b.err != nil:
			return 0, b.err
		case b.eof:
			return 0, io.EOF
		case b.timedOut:
			return 0, os.ErrDeadlineExceeded
		}
		if b.expect {
			b.expect = false
			c.w.hbuf.Reset()
			c.w.field(":status", "100")
			c.headerBlockLocked(b.st.id, false)
			c.flushLocked()
			continue
		}
		if len(p) == 0 {
			return 0, nil
		}
		b.cond.Wait()
	}
	n := copy(p, b.buf[b.off:])
	b.off += n
	if b.off == len(b.buf) {
		b.buf, b.off = b.buf[:0], 0
	}
	b.st.unacked += int64(n)
	c.unackedConn += int64(n)
	c.giveBackLocked(b.st)
	return n, nil
}

// Close discards the rest of the body (its bytes go back to the
// connection's window).
func (b *h2body) Close() error {
	c := b.st.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	c.unackedConn += int64(len(b.buf) - b.off)
	b.buf, b.off = nil, 0
	c.giveBackLocked(nil)
	b.cond.Broadcast()
	return nil
}

func (b *h2body) setDeadline(t time.Time) {
	c := b.st.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if b.timer != nil {
		b.timer.Stop()
	}
	b.gen++
	gen := b.gen
	b.timedOut = false
	if t.IsZero() {
		return
	}
	d := time.Until(t)
	if d <= 0 {
		b.timedOut = true
		b.cond.Broadcast()
		return
	}
	b.timer = time.AfterFunc(d, func() {
		c.mu.Lock()
		b.timedOut = b.timedOut || gen == b.gen
		b.cond.Broadcast()
		c.mu.Unlock()
	})
}
