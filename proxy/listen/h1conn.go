package listen

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	_ "unsafe" // go:linkname

	"golang.org/x/net/http/httpguts"

	"github.com/sluice-proxy/sluice/proxy/internal/rawsock"
)

// Connection states, for Shutdown: idle connections wait for a request
// and are closed at once.
const (
	connIdle int32 = iota
	connActive
	connClosed
)

// Watcher states (h1Conn.watch).
const (
	watchNone    = iota // no watcher
	watchReading        // the watcher reads the connection
	watchWaiting        // it read the next request's first bytes; waits for the handler
	watchDone           // it ended (an error, or the Hijack stopped it)
)

var (
	errClientGone = errors.New("client closed the connection")
	aLongTimeAgo  = time.Unix(1, 0)
	readerPool    = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, h1BufSize) }}
)

// h1Conn is one HTTP/1.x connection of the h1 server.
type h1Conn struct {
	srv    *h1Server
	rwc    net.Conn
	sock   *rawsock.Conn // rwc's socket, read and written raw (rawSockOf); nil: through rwc
	lr     limitReader
	br     *bufio.Reader
	out    []byte // the response's bytes on their way to the socket
	body   []byte // a response's body held until the handler returns or it outgrows h1BufSize
	ctx    context.Context
	remote string
	state  atomic.Int32
	served bool // a request was served: the h2c preface is looked for only before
	armed  bool // the head's read limit was set before the wait for its first bytes
	// dl: a read deadline is set on the socket; dlHead: it is the head's
	// (setReadDeadline). Only the goroutine serving the connection (or
	// the handler it runs) sets them.
	dl, dlHead bool

	// The watcher (see h1serve.go), under wmu.
	wmu     sync.Mutex
	watch   int
	running bool // a handler runs (or its response is being finished)
	// bodyEnded: the running request's body was read to its end (or it
	// had none); a watcher may start only then. A timer armed for an
	// earlier request whose function had already started when Stop ran
	// would otherwise claim the watch of the next request while its
	// handler still reads the body from the same reader.
	bodyEnded bool
	stop      bool // the Hijack asked the watcher to stop
	closing   bool // the connection is closing: a waiting watcher exits
	cancel    context.CancelCauseFunc
	wake      chan struct{} // cap 1: to the waiting watcher, or from it to the Hijack

	watchT *time.Timer // starts the watcher h1WatchDelay after the body's end

	dateSec int64
	date    []byte

	// spare is the last response's header map, emptied, for the next
	// response on this connection (see finish): a response map sized for
	// a proxied answer is four allocations and ≈ 1.4 KB per request.
	// Only the goroutine that serves the next request reads it.
	spare http.Header
}

// serve is the connection's first goroutine.
func (c *h1Conn) serve() {
	c.br = readerPool.Get().(*bufio.Reader)
	c.lr.r, c.lr.remain = c.rwc, math.MaxInt64
	if c.sock = rawSockOf(c.rwc); c.sock != nil {
		c.lr.r = c.sock
	}
	c.br.Reset(&c.lr)
	c.remote = c.rwc.RemoteAddr().String()
	ctx := context.WithValue(c.srv.connBase, http.LocalAddrContextKey, c.rwc.LocalAddr())
	c.ctx = ConnContext(ctx, c.rwc)
	c.loop(false)
}

// loop serves requests until the connection closes, is hijacked or goes
// on on a watcher. watched: this goroutine is the watcher that read the
// next request's first bytes.
func (c *h1Conn) loop(watched bool) {
	for {
		if !watched {
			if c.br.Buffered() == 0 {
				// The head's limit counts from its first byte, the one
				// this wait reads (net/http's, on a kept connection,
				// from after it: up to one buffer more).
				c.lr.remain, c.armed = h1HeadLimit, true
				if c.served {
					c.setReadDeadline(time.Now().Add(c.srv.idle), false)
				}
				if _, err := c.br.Peek(1); err != nil {
					c.close()
					c.release()
					return
				}
			}
		}
		watched = false
		c.state.Store(connActive)
		if !c.served && c.h2Preface() {
			return
		}
		w, err := c.readRequest()
		if err != nil {
			c.fail(err)
			c.release()
			return
		}
		c.served = true
		if !c.serveRequest(w) || !c.finish(w) {
			return
		}
	}
}

// serveRequest runs the handler; a panic (http.ErrAbortHandler: on
// purpose) cuts the connection with the response unfinished, as net/http
// does, and reports false.
func (c *h1Conn) serveRequest(w *h1Response) (ok bool) {
	defer func() {
		if ok {
			return
		}
		err := recover()
		if err != http.ErrAbortHandler {
			c.srv.s.Log.Error("http: panic serving "+c.remote, "err", err, "stack", string(debug.Stack()))
		}
		w.cancel(nil)
		w.done.Store(true)
		if w.hijacked {
			w.unbase()
			return
		}
		c.out = c.out[:0]
		c.wmu.Lock()
		c.running = false
		if c.watchT != nil {
			c.watchT.Stop()
		}
		c.closing = true
		watch := c.watch
		c.wmu.Unlock()
		c.close()
		switch watch {
		case watchWaiting:
			c.wake <- struct{}{}
		case watchNone, watchDone:
			c.release()
		}
	}()
	c.srv.handler.ServeHTTP(w, w.req)
	return true
}

const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// h2Preface hands the connection to the h2c server when it opens with the
// HTTP/2 preface, and reports whether it did.
func (c *h1Conn) h2Preface() bool {
	p, _ := c.br.Peek(min(c.br.Buffered(), len(h2Preface)))
	if len(p) == 0 || !strings.HasPrefix(h2Preface, string(p)) {
		return false
	}
	if len(p) < len(h2Preface) {
		c.headDeadline()
		var err error
		if p, err = c.br.Peek(len(h2Preface)); err != nil || string(p) != h2Preface {
			return false // ReadRequest answers what this is
		}
	}
	c.setReadDeadline(time.Time{}, false)
	buf, _ := c.br.Peek(c.br.Buffered())
	c.srv.forget(c)
	c.srv.handH2(c.rwc, buf)
	c.release()
	return true
}

// h1HeadLimit bounds the bytes a request's head may take from the socket:
// net/http's MaxHeaderBytes plus its 4 KiB of slack.
const h1HeadLimit = maxHeaderBytes + 4096

// h1HeaderHint is the size hint of a response's header map.
const h1HeaderHint = 16

// h1SpareFields bounds the header map kept for the next response: a map
// that grew larger than a proxied answer's is let go, not emptied on every
// request (clear costs its capacity).
const h1SpareFields = 2 * h1HeaderHint

// readRequest is net/http's request parser without http.ReadRequest's
// deletion of the Host field, which the server's Host rules need to see
// (net/http's server calls it so; it is marked for linkname use). It
// reads the heads the own parser (h1parse.go) leaves: chunked bodies,
// obs-fold, heads past the read buffer, and every head net/http refuses,
// so that those answers stay net/http's.
//
//go:linkname readRequest net/http.readRequest
func readRequest(b *bufio.Reader) (*http.Request, error)

// isH2Upgrade reports whether req is the HTTP/2 preface read as a request
// (net/http exempts it from the Host rule).
func isH2Upgrade(req *http.Request) bool {
	return req.Method == "PRI" && len(req.Header) == 0 && req.URL.Path == "*" && req.Proto == "HTTP/2.0"
}

// statusError is a request the server refuses with status; text, when
// set, follows the status text in the answer (as net/http words it).
type statusError struct {
	status int
	text   string
	http10 bool // the request's version, for a 417 (a response of the handler's kind)
}

func (e statusError) Error() string { return http.StatusText(e.status) + ": " + e.text }

// readRequest reads and checks the next request's head.
func (c *h1Conn) readRequest() (*h1Response, error) {
	if !c.armed {
		c.lr.remain = h1HeadLimit
	}
	c.armed = false
	// The header map is sized for a proxied answer's fields (a small
	// request's has 14: request ids, rate limits, Server-Timing, …), so
	// it is not grown twice while the handler fills it.
	hdr := c.spare
	c.spare = nil
	if hdr == nil {
		hdr = make(http.Header, h1HeaderHint)
	}
	w := &h1Response{c: c, contentLength: -1, header: hdr}
	w.body.w = w
	var req *http.Request
	var h parsedHead
	if c.readHead(&h, &w.url) {
		w.reqv = h.request()
		req = &w.reqv
		if h.contentLength > 0 {
			w.lbody = lengthBody{limitReader{r: c.br, remain: h.contentLength}}
			w.body.rc = &w.lbody
		} else {
			w.body.rc = http.NoBody
		}
		c.lr.remain = math.MaxInt64
		c.clearReadDeadline()
	} else {
		var err error
		c.headDeadline()
		if req, err = c.readRequestNetHTTP(); err != nil {
			return nil, err
		}
		w.body.rc = req.Body
	}
	if w.body.rc == http.NoBody {
		w.body.eof.Store(true)
	}
	if ex := req.Header["Expect"]; len(ex) > 0 && ex[0] != "" {
		// net/http's rules: 100-continue among the first value's
		// tokens (honoured on HTTP/1.1 with a body), else 417.
		if hasToken(ex[:1], "100-continue") {
			w.expect = req.ProtoAtLeast(1, 1) && !w.body.eof.Load()
		} else {
			return nil, statusError{status: http.StatusExpectationFailed, http10: !req.ProtoAtLeast(1, 1)}
		}
	}
	ctx, cancel := context.WithCancelCause(c.ctx)
	w.cancel = cancel
	req.RemoteAddr = c.remote
	req.Body = &w.body
	if req == &w.reqv {
		// The request with its context: in w, not a copy of its own.
		w.reqv = *req.WithContext(ctx)
		w.req = &w.reqv
	} else {
		w.req = req.WithContext(ctx)
	}
	w.wantClose = req.Close
	w.head = req.Method == http.MethodHead
	w.is11 = req.ProtoAtLeast(1, 1)
	c.wmu.Lock()
	c.watch, c.running, c.stop, c.cancel, c.bodyEnded = watchNone, true, false, cancel, false
	c.wmu.Unlock()
	if c.srv.stopped.Load() { // the server stopped before this request ran (stopRequests)
		cancel(context.Cause(c.srv.s.base))
	}
	if w.body.eof.Load() {
		c.bodyDone()
	}
	return w, nil
}

// setReadDeadline sets the socket's read deadline and remembers it: head
// says it is the head's (headDeadline).
func (c *h1Conn) setReadDeadline(t time.Time, head bool) error {
	c.dl, c.dlHead = !t.IsZero(), head
	return c.rwc.SetReadDeadline(t)
}

// headDeadline bounds the reading of a request's head by the header
// timeout, from the first read the head needs past the bytes its wait
// (loop's Peek) brought, unless it is bounded already. A head that came
// whole in those bytes — nearly every request — needs no deadline: two
// updates of the runtime's poll timer fewer per request (one on a kept
// connection, whose idle deadline is cleared instead).
func (c *h1Conn) headDeadline() {
	if !c.dlHead {
		c.setReadDeadline(time.Now().Add(c.srv.headTimeout), true)
	}
}

// clearReadDeadline clears the socket's read deadline when one is set:
// the head was read, the body and the handler have none of the server's.
func (c *h1Conn) clearReadDeadline() {
	if c.dl {
		c.setReadDeadline(time.Time{}, false)
	}
}

// readHead parses the next request's head with the fast parser
// (h1parse.go) into h, reading more of it while it does not fit yet, and
// reports whether it took it; if not, the head is still unread in the
// buffer for net/http's parser.
func (c *h1Conn) readHead(h *parsedHead, u *url.URL) bool {
	seen := 0
	for {
		buf, _ := c.br.Peek(c.br.Buffered())
		// A head ends, or is found not to be the fast parser's, only at a
		// line's end: bytes without one (a client sending a byte at a
		// time) are not scanned again.
		res := headMore
		n := 0
		if bytes.IndexByte(buf[seen:], '\n') >= 0 {
			n, res = parseHead(buf, h, u)
		}
		seen = len(buf)
		switch res {
		case headOK:
			c.br.Discard(n)
			return true
		case headMore:
			if len(buf) < c.br.Size() {
				c.headDeadline()
				if _, err := c.br.Peek(len(buf) + 1); err == nil {
					continue
				}
			}
		}
		return false
	}
}

// readRequestNetHTTP reads the request's head with net/http's parser and
// applies net/http's server's checks to it.
func (c *h1Conn) readRequestNetHTTP() (*http.Request, error) {
	req, err := readRequest(c.br)
	if err != nil {
		if c.lr.remain <= 0 {
			return nil, statusError{status: http.StatusRequestHeaderFieldsTooLarge, text: ""}
		}
		return nil, err
	}
	c.lr.remain = math.MaxInt64
	c.clearReadDeadline()
	if err := checkRequest(req); err != nil {
		return nil, err
	}
	return req, nil
}

// checkRequest applies net/http's server's checks to a request read by
// net/http's parser, and deletes its Host field.
func checkRequest(req *http.Request) error {
	if req.ProtoMajor != 1 {
		req.Body.Close()
		return statusError{status: http.StatusHTTPVersionNotSupported, text: "unsupported protocol version"}
	}
	// The Host rules as net/http's server applies them, on the Host
	// field itself (http.ReadRequest would have deleted it): present,
	// even empty, on HTTP/1.1 (RFC 9112 section 3.2, also with an
	// absolute-form target), and well-formed.
	hosts, haveHost := req.Header["Host"]
	if req.ProtoMinor >= 1 && (!haveHost || len(hosts) == 0) && !isH2Upgrade(req) && req.Method != "CONNECT" {
		return statusError{status: http.StatusBadRequest, text: "missing required Host header"}
	}
	if len(hosts) == 1 && !httpguts.ValidHostHeader(hosts[0]) {
		return statusError{status: http.StatusBadRequest, text: "malformed Host header"}
	}
	for k, vv := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return statusError{status: http.StatusBadRequest, text: "invalid header name"}
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return statusError{status: http.StatusBadRequest, text: "invalid header value"}
			}
		}
	}
	delete(req.Header, "Host")
	return nil
}

// fail answers a request the server could not read or refuses, then closes
// the connection.
func (c *h1Conn) fail(err error) {
	var se statusError
	switch {
	case errors.As(err, &se):
	case err.Error() == "unsupported transfer encoding" || strings.HasPrefix(err.Error(), "unsupported transfer encoding"):
		se = statusError{status: http.StatusNotImplemented, text: ""}
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, net.ErrClosed):
		c.close() // the client left, or was too slow: no answer
		return
	default:
		// A target net/url refuses is a *url.Error, which is also a
		// net.Error: a bad request, not a failed read.
		var ue *url.Error
		var ne net.Error
		if !errors.As(err, &ue) && errors.As(err, &ne) {
			c.close()
			return
		}
		se = statusError{status: http.StatusBadRequest, text: ""}
	}
	// The answers are net/http's, byte for byte.
	const errorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
	c.rwc.SetWriteDeadline(time.Now().Add(time.Second))
	code, text := se.status, http.StatusText(se.status)
	switch {
	case code == http.StatusExpectationFailed:
		b := appendStatus(c.out[:0], !se.http10, code)
		b = append(b, "Connection: close\r\nDate: "...)
		b = c.appendDate(b)
		b = append(b, "\r\nContent-Length: 0\r\n\r\n"...)
		c.rwc.Write(b)
		c.out = b[:0]
	case code == http.StatusNotImplemented:
		fmt.Fprintf(c.rwc, "HTTP/1.1 %d %s%sUnsupported transfer encoding", code, text, errorHeaders)
	case se.text != "":
		fmt.Fprintf(c.rwc, "HTTP/1.1 %d %s: %s%s%d %s: %s", code, text, se.text, errorHeaders, code, text, se.text)
	default:
		fmt.Fprintf(c.rwc, "HTTP/1.1 %d %s%s%d %s", code, text, errorHeaders, code, text)
	}
	c.closeWriteAndWait()
}

// closeWriteAndWait ends the connection after an error answer: the write
// side first, then, after a short wait for the client to read it, the
// rest (closing with unread bytes would reset the connection under the
// answer).
func (c *h1Conn) closeWriteAndWait() {
	if cw, ok := c.rwc.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	} else if tc := tcpConnOf(c.rwc); tc != nil {
		tc.CloseWrite()
	}
	c.setReadDeadline(time.Now().Add(500*time.Millisecond), false)
	io.CopyN(io.Discard, c.rwc, 1<<20)
	c.close()
}

func tcpConnOf(c net.Conn) *net.TCPConn {
	for range 4 {
		switch t := c.(type) {
		case *net.TCPConn:
			return t
		case *capConn:
			c = t.Conn
		case *keptConn:
			c = t.Conn
		case *proxyConn:
			c = t.Conn
		default:
			return nil
		}
	}
	return nil
}

// bodyDone arms the watcher once the request's body was read to its end
// (or it had none): it starts if the handler still runs watchDelay later.
// A handler that answers or hands its connection off sooner (a small
// request, a stream going to the event loops) pays no goroutine and no
// aborted read for it.
func (c *h1Conn) bodyDone() {
	c.wmu.Lock()
	c.bodyEnded = true
	c.wmu.Unlock()
	d := c.srv.watchDelay
	if d <= 0 {
		if c.claimWatch() {
			go c.watchConn()
		}
		return
	}
	if c.watchT == nil {
		c.watchT = time.AfterFunc(d, c.watchLate)
		return
	}
	c.watchT.Reset(d)
}

// watchLate is the watcher started by the timer (on the timer's own
// goroutine).
func (c *h1Conn) watchLate() {
	if c.claimWatch() {
		c.watchConn()
	}
}

// claimWatch reports whether a watcher is to start: the handler runs (and
// did not hijack), its request's body ended and none was started.
func (c *h1Conn) claimWatch() bool {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.watch != watchNone || !c.running || c.stop || !c.bodyEnded {
		return false
	}
	c.watch = watchReading
	return true
}

// watchConn is the watcher: it reads the connection while the handler runs
// and after; a failure cancels the running request, the next request's
// bytes make it the connection's goroutine once the handler returned.
func (c *h1Conn) watchConn() {
	if c.br.Buffered() == 0 {
		c.lr.remain, c.armed = h1HeadLimit, true // as in loop
	}
	_, err := c.br.Peek(1)
	c.wmu.Lock()
	switch {
	case c.stop:
		c.watch = watchDone
		c.wmu.Unlock()
		c.wake <- struct{}{}
		return
	case err != nil:
		c.watch = watchDone
		if c.running {
			c.cancel(errClientGone) // finish closes the connection
			c.wmu.Unlock()
			return
		}
		c.wmu.Unlock()
		c.close()
		c.release()
		return
	case c.running:
		c.watch = watchWaiting
		c.wmu.Unlock()
		<-c.wake
		c.wmu.Lock()
		closing := c.closing
		c.wmu.Unlock()
		if closing {
			c.release()
			return
		}
	default:
		c.wmu.Unlock()
	}
	c.loop(true)
}

// stopWatch stops the watcher for a Hijack (the bytes it read stay in the
// read buffer).
func (c *h1Conn) stopWatch() {
	c.wmu.Lock()
	c.stop = true
	if c.watchT != nil {
		c.watchT.Stop()
	}
	if c.watch != watchReading {
		c.wmu.Unlock()
		return
	}
	c.wmu.Unlock()
	c.setReadDeadline(aLongTimeAgo, false)
	<-c.wake
	c.setReadDeadline(time.Time{}, false)
}

// finish completes the response after the handler returned and reports
// whether this goroutine serves the connection's next request.
func (c *h1Conn) finish(w *h1Response) bool {
	if w.hijacked {
		w.cancel(nil)
		w.unbase()
		return false
	}
	keep := w.finishResponse()
	w.cancel(nil)
	w.done.Store(true)
	if keep && len(w.header) <= h1SpareFields {
		// The handler returned and the response is written: by
		// ResponseWriter's contract nothing uses its header map any more
		// (Header answers a map of its own from now on), so the next
		// response on this connection reuses it. Set before running goes
		// false under wmu, after which a watcher may read the next request.
		clear(w.header)
		c.spare = w.header
	}
	c.wmu.Lock()
	c.running = false
	if c.watchT != nil {
		c.watchT.Stop()
	}
	watch := c.watch
	if !keep || c.srv.shutting.Load() || watch == watchDone {
		c.closing = true
		c.wmu.Unlock()
		c.close()
		switch watch {
		case watchWaiting:
			c.wake <- struct{}{} // the watcher lets the buffer go
		case watchNone, watchDone:
			c.release()
		} // watchReading: the watcher's read fails; it lets the buffer go
		return false
	}
	c.state.Store(connIdle)
	switch watch {
	case watchReading:
		c.setReadDeadline(time.Now().Add(c.srv.idle), false)
		c.wmu.Unlock()
		return false // the watcher serves the next request
	case watchWaiting:
		c.wmu.Unlock()
		c.wake <- struct{}{}
		return false
	}
	c.wmu.Unlock()
	return true
}

// close closes the connection (again: harmless) and stops tracking it.
func (c *h1Conn) close() {
	c.state.Store(connClosed)
	c.rwc.Close()
	c.srv.forget(c)
	c.wmu.Lock()
	c.closing = true
	c.wmu.Unlock()
}

// release gives the read buffer back; only the goroutine that reads it
// last calls it.
func (c *h1Conn) release() {
	if c.br != nil {
		c.br.Reset(nil)
		readerPool.Put(c.br)
		c.br = nil
	}
}

// appendDate appends the Date header's value (reformatted once a second).
func (c *h1Conn) appendDate(b []byte) []byte {
	now := time.Now()
	if s := now.Unix(); s != c.dateSec || c.date == nil {
		c.dateSec = s
		c.date = now.UTC().AppendFormat(c.date[:0], http.TimeFormat)
	}
	return append(b, c.date...)
}

// h1Body is a request's body: it counts, starts the watcher at its end,
// sends 100 Continue on the first read when the client expects it, and
// refuses reads after the handler returned.
type h1Body struct {
	w      *h1Response
	rc     io.ReadCloser
	eof    atomic.Bool
	closed atomic.Bool
}

// Whole reports whether reading the rest of the body needs no read from
// the socket: it ended, or all of it (a Content-Length body: a small
// request's, sent with its head) is in the connection's read buffer. A
// read deadline for such a body bounds nothing; proxy's readBody sets none
// then (two timer updates fewer per request). Only the body's reader
// calls it.
func (b *h1Body) Whole() bool {
	if b.eof.Load() {
		return true
	}
	lb, ok := b.rc.(*lengthBody)
	if !ok || b.closed.Load() || b.w.done.Load() {
		return false
	}
	br, ok := lb.r.(*bufio.Reader)
	return ok && int64(br.Buffered()) >= lb.remain
}

func (b *h1Body) Read(p []byte) (int, error) {
	if b.closed.Load() || b.w.done.Load() {
		return 0, http.ErrBodyReadAfterClose
	}
	if b.eof.Load() {
		return 0, io.EOF
	}
	w := b.w
	if w.expect && !w.sentContinue && !w.committed {
		w.sentContinue = true
		w.c.rwc.Write([]byte("HTTP/1.1 100 Continue\r\n\r\n"))
	}
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.eof.Store(true)
		w.c.bodyDone()
	} else if err != nil {
		w.bodyErr = true
	}
	return n, err
}

func (b *h1Body) Close() error {
	b.closed.Store(true)
	return nil
}

// drain reads and discards what the handler left of the body, up to
// h1DrainMax, and reports whether it reached the end.
func (b *h1Body) drain() bool {
	if b.eof.Load() {
		return true
	}
	if b.w.bodyErr || b.w.expect && !b.w.sentContinue {
		return false // the client may never send it
	}
	n, err := io.CopyN(io.Discard, b.rc, h1DrainMax+1)
	if err == io.EOF && n <= h1DrainMax {
		b.eof.Store(true)
		return true
	}
	return false
}
