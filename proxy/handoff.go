package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sluice-proxy/sluice/internal/chunked"
	"github.com/sluice-proxy/sluice/proxy/evloop"
	"github.com/sluice-proxy/sluice/proxy/internal/rawsock"
	"github.com/sluice-proxy/sluice/proxy/listen"
	"github.com/sluice-proxy/sluice/routing"
)

// This file hands committed HTTP/1.1 streams to the event loops
// (proxy/evloop): once a stream's first event is held, its client socket
// (hijacked) and its backend socket (detached from the HTTP/1.1 upstream
// client, proxy/h1up) leave Go's netpoller, and no goroutine waits on the
// stream any more. The per-event work is relayEvent's, on the loop, through
// a sink that appends chunks to the loop's out buffer; the exchange's
// completion (settle, access log, metrics, the attempt's end, the state's
// release) runs on a short-lived goroutine when the loop ends the stream,
// before the client gets the stream's last bytes (as serve's defers do on
// the goroutine path). See docs/ARCHITECTURE.md, "Event loop".

// detacher is a response body that hands its connection over: h1up.Body.
type detacher interface {
	Detach() (conn net.Conn, raw []byte, dec *chunked.Decoder, remaining int64, err error)
}

// returner is a detached body whose connection can go back to its
// client's idle pool once the loop read the body to its end: h1up.Body.
type returner interface {
	Reusable() bool
	Return(net.Conn) bool
}

// reuseFunc is the evloop.Stream's Reuse for a detached body: the
// connection, up itself (it stayed open under the loop), goes to the
// transport's idle pool. Nil when the connection cannot serve another
// request.
func reuseFunc(body any, up net.Conn) func(fd int) {
	rb, ok := body.(returner)
	if !ok || !rb.Reusable() {
		return nil
	}
	return func(int) { rb.Return(up) }
}

func init() {
	parkKept.Store(os.Getenv("SLUICE_KEEP_ON_LOOP") == "1")
}

// parkKept leaves a kept client connection on its event loop until its
// next request arrives (evloop.Parker, listen.ParkConn) instead of
// re-admitting it to the HTTP server at once: off unless
// SLUICE_KEEP_ON_LOOP=1 (docs/BENCHMARKS.md, "h1loop"). A variable for
// the tests of both ways.
var parkKept atomic.Bool

// errHandedOff tells serve's callers that the event loop now owns the
// exchange: it completes it when the stream ends.
var errHandedOff = errors.New("stream handed to the event loop")

// loops is the handler's event loops, started on the first hand-off.
type loops struct {
	once sync.Once
	g    atomic.Pointer[evloop.Group]
}

// eventLoops returns the handler's loops, starting them once; nil when
// they are off or could not start (the goroutine path then serves).
func (h *Handler) eventLoops() *evloop.Group {
	if h.noLoop {
		return nil
	}
	h.loops.once.Do(func() {
		g, err := evloop.New(evloop.Options{})
		if err != nil {
			h.log.Warn("event loops unavailable; streams stay on their goroutines", "err", err)
			return
		}
		h.loops.g.Store(g)
	})
	return h.loops.g.Load()
}

// helpLoops relays what the event loops' sockets have ready on this
// goroutine when their own goroutines are late (evloop.Group.Help): a
// request's start, a hand-off and a completion call it, so that the
// goroutines that keep the Ps busy in a wave of stream starts serve the
// loops' tokens between their own work.
func (h *Handler) helpLoops() {
	if g := h.loops.g.Load(); g != nil && !noHelp.Load() {
		g.Help()
	}
}

// noHelp turns helpLoops off (for the benchmarks of both ways).
var noHelp atomic.Bool

// Close stops the handler's event loops: streams still on them end with
// the shutting_down error event. Call it after the server's Shutdown
// (which waits for loop streams as for running requests).
func (h *Handler) Close() {
	h.loops.once.Do(func() {}) // no loops start after Close
	if g := h.loops.g.Load(); g != nil {
		g.Close()
	}
}

// LoopStreams is the number of streams the event loops relay now.
func (h *Handler) LoopStreams() int64 {
	if g := h.loops.g.Load(); g != nil {
		return g.Streams()
	}
	return 0
}

// LoopParked is the number of kept client connections waiting for their
// next request on the event loops (parkKept).
func (h *Handler) LoopParked() int64 {
	if g := h.loops.g.Load(); g != nil {
		return g.Parked()
	}
	return 0
}

// loopStream is an exchange's stream on a loop: the Relay the loop calls.
type loopStream struct {
	x       *exchange
	l       *leg
	sink    loopSink
	h       *evloop.Handle
	release func()        // the server's hold (listen.Hold)
	uncount func()        // the connection cap's count (listen.KeepCounted)
	stopAt  func() bool   // stops the drain watch
	done    chan struct{} // closed when the handle is set (Add returned)
	// keep: the client's connection goes back to the server after a
	// clean end (Keep): conn is the hijacked connection (its identity),
	// prefix what the client sent after the request that net/http read.
	keep   bool
	conn   net.Conn
	prefix []byte
	// framed is the client's side of an HTTP/2 or HTTP/3 stream
	// (handoff_h2.go).
	framed loopClient
}

// holdServer counts ls as a running handler of its server (listen.Hold:
// Shutdown waits for it) until it ends; the drain's deadline ends it with
// the shutting_down event once the loop has it.
func (ls *loopStream) holdServer(ctx context.Context) {
	var stopped context.Context
	ls.release, stopped = listen.Hold(ctx)
	if stopped != nil {
		ls.stopAt = context.AfterFunc(stopped, func() {
			<-ls.done
			if ls.h != nil {
				ls.h.End(context.Cause(stopped))
			}
		})
	}
}

// refused undoes holdServer and the exchange's tie to ls for a stream no
// loop took: the stream is its goroutine's again.
func (ls *loopStream) refused() {
	ls.x.loop = nil
	close(ls.done)
	if ls.stopAt != nil {
		ls.stopAt()
	}
	ls.release()
}

// loopable returns what a hand-off of l's stream to an event loop needs,
// whatever the client's protocol: the HTTP sink (not the WebSocket
// bridge), a backend body that detaches and the loops; g is nil when the
// stream must stay on its goroutine.
func (x *exchange) loopable(l *leg) (s *httpSink, d detacher, g *evloop.Group) {
	s, isHTTP := x.sink.(*httpSink)
	if !isHTTP {
		return nil, nil, nil
	}
	d, detaches := l.resp.Body.(detacher)
	if !detaches {
		return nil, nil, nil
	}
	return s, d, x.h.eventLoops()
}

// handOff moves l's stream to an event loop when it can: an HTTP/1.1
// client over cleartext TCP, the HTTP sink, a backend body that detaches.
// It reports false, having changed nothing, when the stream stays on this
// goroutine; else relayOpenAI returns err: errHandedOff when the loop has
// the stream, nil when it ended with its first event, or why it failed.
func (x *exchange) handOff(l *leg) (ok bool, err error) {
	r := x.r
	if r.ProtoMajor != 1 || r.TLS != nil {
		return false, nil
	}
	s, d, g := x.loopable(l)
	if g == nil {
		return false, nil
	}
	x.netRTT() // read while the client's socket is Go's (the access log reports it)
	// The backend's socket first: a body that already ended (all of it
	// read with the first event) or failed stays on this goroutine.
	up, raw, dec, remaining, err := d.Detach()
	if err != nil {
		return false, nil
	}
	reuse := reuseFunc(l.resp.Body, up)
	early, earlyKeep := listen.EarlySocket(r.Context())
	if early == nil {
		return x.handOffHijacked(l, s, g, up, raw, dec, remaining, reuse)
	}
	// The head and the first token are built and written before the
	// Hijack, through the socket under net/http's connection (nothing
	// was written on it for this request, and net/http's background read
	// does not write): the Hijack (which waits for that read to stop),
	// the rest of the hand-off and the loop's start come after the first
	// token left.
	hdr := x.commitLoopHead(l, s)
	l.wd.stop() // the loop watches idleness
	ls, done := x.firstBytes(l, hdr, nil, keepAlive(r) && earlyKeep)
	ls.sink.out = ls.sink.out[writeRaw(early, ls.sink.out):]
	x.firstSent = time.Now()
	conn, brw, err := s.rc.Hijack()
	if err != nil {
		// Not hijackable after all, with the first bytes sent (net/http
		// refuses a Hijack only of a connection hijacked before or not
		// HTTP/1): the client's connection is shut down, the stream fails.
		early.Control(func(fd uintptr) { syscall.Shutdown(int(fd), syscall.SHUT_RDWR) })
		up.Close()
		l.outcome = routing.Failed
		x.sink = discardSink{}
		return true, fmt.Errorf("hand-off to the event loop: %w", err)
	}
	ls.conn = conn
	if done {
		return true, x.loopAbort(conn, up, nil)
	}
	return x.handOffRest(l, ls, g, conn, brw, up, raw, dec, remaining, reuse)
}

// handOffHijacked is handOff for a connection whose socket is not known
// before the Hijack (not from a listener of package listen): the head and
// first token are written after it.
func (x *exchange) handOffHijacked(l *leg, s *httpSink, g *evloop.Group, up net.Conn, raw []byte, dec *chunked.Decoder,
	remaining int64, reuse func(int)) (bool, error) {
	r := x.r
	conn, brw, err := s.rc.Hijack()
	if err != nil {
		// Not hijackable after all: nothing was sent, the client gets a 502.
		up.Close()
		l.outcome = routing.Failed
		return true, fmt.Errorf("hand-off to the event loop: %w", err)
	}
	// From here the response is ours to write.
	hdr := x.commitLoopHead(l, s)
	if !hasFD(conn) {
		return true, x.loopAbort(conn, up, errors.New("client connection has no descriptor"))
	}
	l.wd.stop() // the loop watches idleness
	// The handler returns now and its request's context is cancelled
	// then, but the exchange goes on: nothing after this point consults
	// that context (loopFailed is told why the stream ended).
	ls, done := x.firstBytes(l, hdr, conn, keepAlive(r) && listen.CanReadmit(conn))
	if done {
		return true, x.loopAbort(conn, up, nil)
	}
	// The head and the first token leave now, before the rest of the
	// hand-off (shedding, the server's hold, both sockets taken out of
	// Go's netpoller: a dozen system calls); what the socket does not
	// take goes to Add, and from there to the loop.
	ls.sink.out = ls.sink.out[writeNow(conn, ls.sink.out):]
	x.firstSent = time.Now()
	return x.handOffRest(l, ls, g, conn, brw, up, raw, dec, remaining, reuse)
}

// commitLoopHead commits the response a loop stream will write (its
// header: the backend's, the trailer's announcement, Server-Timing) and
// returns that header; the first token is l's first event.
func (x *exchange) commitLoopHead(l *leg, s *httpSink) http.Header {
	x.firstToken = l.first
	hdr := s.w.Header()
	x.announceTrailer(hdr)
	x.commitHeader(l.resp.Header, true)
	return hdr
}

// firstBytes makes a loop stream's record and builds its head and its
// first event's bytes in ls.sink.out (conn may be nil yet: the early
// write comes before the Hijack). done: the stream ended with its first
// event; no loop is needed, and loopAbort closes the connection, which
// the head then says.
func (x *exchange) firstBytes(l *leg, hdr http.Header, conn net.Conn, keep bool) (*loopStream, bool) {
	ls := &loopStream{x: x, l: l, done: make(chan struct{}), conn: conn, keep: keep}
	ls.sink.hdr = hdr
	ls.sink.trailer = wantsTrailer(x.r)
	ls.sink.plain = !x.r.ProtoAtLeast(1, 1)
	x.sink = &ls.sink
	// One buffer sized for the head (≈ 1 KiB with Sluice's fields) and
	// what arrived with the first event, not a dozen appends' growth on
	// the first token's path (the loop copies what the first write leaves).
	size := firstWriteHead + 2*len(l.ev)
	if l.br != nil {
		size += l.br.Buffered()
	}
	ls.sink.out = appendHead(make([]byte, 0, size), hdr, time.Now(), keep, ls.sink.plain)
	headLen := len(ls.sink.out)
	done, _ := x.relayEvent(l, l.ev, l.first)
	if !done {
		done, _ = x.relayBuffered(l)
	}
	if done && keep {
		ls.sink.out = slices.Insert(ls.sink.out, headLen-2, []byte("Connection: close\r\n")...)
	}
	if f := firstBytesSeen.Load(); f != nil {
		var rest []byte
		if l.br != nil {
			rest, _ = l.br.Peek(l.br.Buffered())
		}
		(*f)(ls.sink.out, rest)
	}
	return ls, done
}

// firstBytesSeen, when set (tests), is shown each hand-off's first bytes
// and the backend's input it leaves to the loop.
var firstBytesSeen atomic.Pointer[func(first, rest []byte)]

// relayBuffered relays, after the first event, the complete events l's
// reader already holds, so that they leave with the head in the first
// write instead of after the loop's start (an eventfd wake-up, the loop's
// batch, two epoll_ctl): a backend that sends a role-only chunk and the
// first content token together — vLLM's first iteration does — had its
// first token, the one a client's TTFT counts, wait for the hand-off. It
// stops before the stream's last event, which the loop relays (a stream
// that ends on its loop keeps its connection), and never reads from the
// socket. done: the stream ended here (the client is gone; err is
// relayEvent's). relayOpenAI calls it too, before an HTTP/2 or HTTP/3
// stream's hand-off (handOffFramed) and on the goroutine path.
func (x *exchange) relayBuffered(l *leg) (done bool, err error) {
	for l.br != nil {
		p, _ := l.br.Peek(l.br.Buffered())
		start, end := nextEvent(p)
		if end == 0 {
			return false, nil
		}
		ev := p[start:end]
		if x.endsStream(ev, EventData(ev)) {
			l.br.Discard(start)
			return false, nil
		}
		done, err = x.relayEvent(l, ev, l.first) // it arrived with the first
		l.br.Discard(end)
		if done || err != nil {
			return true, err
		}
	}
	return false, nil
}

// nextEvent finds p's first complete SSE event, p[start:end] through the
// blank line that ends it (stray blank lines before it skipped, as the
// loop's split and readEvent skip them); end is 0 when p holds none.
func nextEvent(p []byte) (start, end int) {
	for i := 0; ; {
		j := bytes.IndexByte(p[i:], '\n')
		if j < 0 {
			return 0, 0
		}
		e := i + j + 1
		if e-i == 1 || e-i == 2 && p[i] == '\r' { // a blank line
			if i > start {
				return start, e
			}
			start = e
		}
		i = e
	}
}

// handOffRest is the hand-off after the first bytes were written (what
// the socket did not take is in ls.sink.out): the leg's buffers go, the
// exchange sheds what a loop stream does not need, and the loop takes the
// stream.
func (x *exchange) handOffRest(l *leg, ls *loopStream, g *evloop.Group, conn net.Conn, brw *bufio.ReadWriter, up net.Conn,
	raw []byte, dec *chunked.Decoder, remaining int64, reuse func(int)) (bool, error) {
	r := x.r
	// Nothing writes through the hijacked response writer again; held in
	// the exchange (x.hsink) it would keep the server's connection state
	// and read buffer alive as long as the stream (4–6 KiB per held stream).
	x.hsink = httpSink{}
	// The leg's read buffers are not needed any more: an idle stream on
	// the loop holds none.
	pending := l.handOverBuffers()
	if n := brw.Reader.Buffered(); n > 0 {
		// The client pipelined a request after this one (the body was
		// read to its end): with keep-alive it is served on the
		// connection after this stream; else this response says
		// Connection: close and that request gets no answer.
		if ls.keep {
			p, _ := brw.Reader.Peek(n)
			ls.prefix = bytes.Clone(p)
		}
		brw.Reader.Discard(n)
	}
	x.shed(l)
	ls.holdServer(r.Context())
	x.loop = ls
	out := ls.sink.out
	ls.sink.out = nil // the loop's from here
	// The client's connection counts against its address's cap until the
	// loop closes its socket when the stream ends (unless the server
	// takes it back).
	ls.uncount = listen.KeepCounted(conn)
	es := &evloop.Stream{Client: conn, Upstream: up, Out: out, Pending: pending, Raw: raw,
		Decoder: dec, Remaining: remaining, Idle: x.st.Config.StreamIdleTimeout, Relay: ls.relay(), Reuse: reuse, KeepInput: ls.keep}
	h, err := g.Add(es)
	if err != nil {
		// The loops are closed (the handler is shutting down) or failed,
		// or the sockets could not be taken: the backend's socket is
		// closed; complete here.
		ls.uncount()
		ls.refused()
		cause := addErr(err)
		if es.Client != nil {
			// The client's connection is ours again (Add leaves it when no
			// loop takes streams), its first bytes sent: the stream ends
			// with the error event, not a silent cut (deferredSink writes
			// what Add did not, the event and the last chunk, then closes
			// it).
			ls.sink.out = es.Out
			es.Client.SetWriteDeadline(time.Now().Add(10 * time.Second))
			x.sink = &deferredSink{conn: es.Client, ls: &ls.sink}
			x.loopFailed(l, cause)
		} else if !errors.Is(cause, listen.ErrDraining) {
			x.logLoopFailed(cause) // the client is cut: at least the log says why
		}
		return true, cause
	}
	ls.h = h
	close(ls.done)
	x.h.helpLoops()
	return true, errHandedOff
}

// shed lets go of what a stream on a loop no longer needs, so that a held
// stream keeps only what its events and its completion read (see
// docs/BENCHMARKS.md, "heldrss"):
//   - the client's request becomes a copy without its body: the server's
//     body reader holds the connection's 4 KiB read buffer (net/http does
//     not pool it back after a Hijack), and the body was read long ago;
//   - the request body and its share of the body memory budget (a stream
//     that is relayed is not retried);
//   - the backend's response but for its status (its header was copied into
//     the client's head; its request, with its header, goes too);
//   - the client's response header (appendHead wrote it).
//
// A hedged exchange keeps all but the header: the losing leg may still be
// running on its goroutine, reading the request, the body and its race.
func (x *exchange) shed(l *leg) {
	if ls, ok := x.sink.(*loopSink); ok {
		ls.hdr = nil
	}
	if x.hedging != nil {
		return
	}
	nr := new(http.Request)
	*nr = *x.r
	nr.Body, nr.GetBody = http.NoBody, nil
	if x.r.URL != nil {
		// The own h1 server keeps a request's URL inside its response
		// writer: pointing there, the copy would keep the writer and the
		// connection's state behind it alive (TestLoopStreamDropsResponseWriter).
		u := *x.r.URL
		nr.URL = &u
	}
	x.r = nr
	x.bodyLen, x.body = len(x.body), nil
	x.h.bodies.release(x.bodyMem)
	x.bodyMem = 0
	l.resp = statusOnly(l.resp.StatusCode)
}

// ok200 is the backend response a stream on a loop keeps when it was a 200
// (the usual case; shared, never changed): only its status is read.
var ok200 = &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}

// statusOnly is a response with only a status and no body.
func statusOnly(code int) *http.Response {
	if code == http.StatusOK {
		return ok200
	}
	return &http.Response{StatusCode: code, Body: http.NoBody}
}

// loopAbort ends a hijacked exchange on this goroutine: its head and first
// event when the stream ended with it (err nil), else a 502 when nothing
// could be relayed. The completion runs as on the goroutine path.
func (x *exchange) loopAbort(conn, up net.Conn, err error) error {
	if up != nil {
		up.Close()
	}
	if err != nil {
		defer conn.Close()
		x.status = http.StatusBadGateway
		x.err = err
		e := ErrorOf(err)
		body := x.errorBody(e)
		conn.Write(append([]byte("HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: "+
			strconv.Itoa(len(body)+1)+"\r\n\r\n"), append(body, '\n')...))
		x.sink = discardSink{}
		return err
	}
	ls := x.sink.(*loopSink)
	conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	conn.Write(ls.out)
	ls.out = nil
	x.sink = &deferredSink{conn: conn, ls: ls}
	return nil
}

// writeNow writes as much of b as c's socket takes at once, without
// waiting for it to become writable, and returns how much that was: 0
// when c exposes no socket or the write fails (the loop's own write then
// meets the error).
func writeNow(c net.Conn, b []byte) int {
	sc, ok := c.(syscall.Conn)
	if !ok || len(b) == 0 {
		return 0
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0
	}
	return writeRaw(rc, b)
}

// writeRaw is writeNow on a socket: it writes as much of b as rc takes
// at once, without waiting, and returns how much that was.
func writeRaw(rc syscall.RawConn, b []byte) int {
	if len(b) == 0 {
		return 0
	}
	w := nowWriter{b: b}
	rc.Write(w.write)
	return w.n
}

// nowWriter is writeNow's callback and its result.
type nowWriter struct {
	b []byte
	n int
}

// write never asks to wait for writability (it returns true). The write
// is raw (rawsock.WriteFD): through syscall.Write's entersyscall, the
// first token's write was the call that woke sysmon from its deep sleep,
// right before the write (docs/BENCHMARKS.md, "start19").
func (w *nowWriter) write(fd uintptr) bool {
	for w.n < len(w.b) {
		k, err := rawsock.WriteFD(fd, w.b[w.n:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil || k <= 0 {
			break
		}
		w.n += k
	}
	return true
}

// hasFD reports whether conn (or what it wraps) exposes its socket.
func hasFD(conn net.Conn) bool {
	_, ok := conn.(syscall.Conn)
	return ok
}

// appendHead appends the response head as net/http would write it for a
// streamed answer: status line, the header (sorted), Date, chunked
// coding, and Connection: close unless keep (the connection goes back to
// the server after the stream). With plain (an HTTP/1.0 client, which has
// no chunked coding) the body is not chunked: it ends with the
// connection, which the head says (Connection: close, as nginx says it;
// net/http sends no Connection header to a 1.0 client, which means the
// same); keep must be false.
func appendHead(b []byte, h http.Header, now time.Time, keep, plain bool) []byte {
	b = append(b, "HTTP/1.1 200 OK\r\n"...)
	h.Del("Content-Length")
	h.Del("Transfer-Encoding")
	h.Del("Connection")
	b = listen.AppendHeader(b, h)
	if _, ok := h["Date"]; !ok {
		b = append(b, "Date: "...)
		b = now.UTC().AppendFormat(b, http.TimeFormat)
		b = append(b, "\r\n"...)
	}
	if plain {
		return append(b, "Connection: close\r\n\r\n"...)
	}
	if keep {
		return append(b, "Transfer-Encoding: chunked\r\n\r\n"...)
	}
	return append(b, "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"...)
}

// firstWriteHead is what firstBytes reserves for a stream's head: Sluice's
// fields (the rate-limit pairs, two request ids, Server-Timing) and the
// backend's few come to ≈ 1 KiB; the first events and their chunk framing
// come on top (2×len(ev) and what is buffered).
const firstWriteHead = 1536

// keepAlive reports whether the client's request lets its connection
// serve another: HTTP/1.1 without Connection: close (net/http's r.Close).
// HTTP/1.0 is not kept, even with Connection: keep-alive: a stream's
// length is unknown, and without chunked coding its end is the
// connection's close (loopSink.plain).
func keepAlive(r *http.Request) bool {
	return r.ProtoMajor == 1 && r.ProtoMinor >= 1 && !r.Close
}

// Event runs the exchange's per-event work on the loop (see relayEvent).
func (ls *loopStream) Event(out, ev []byte, now time.Time) ([]byte, bool) {
	ls.sink.out = out
	done, err := ls.x.relayEvent(ls.l, ev, now)
	ls.l.att.Progress(now)
	out, ls.sink.out = ls.sink.out, nil
	return out, done || err != nil
}

// End appends the stream's error event when it failed, holds the stream
// and starts the completion, which gives the last bytes (Finish) once the
// request is settled and logged.
func (ls *loopStream) End(out []byte, err error) ([]byte, bool) {
	x := ls.x
	ls.sink.out = out
	if err != nil {
		x.loopFailed(ls.l, loopErr(err))
	} else if x.lastToken.IsZero() {
		x.lastToken = time.Now()
	}
	out, ls.sink.out = ls.sink.out, nil
	go ls.complete()
	return out, true
}

// Keep gives the client's socket back to the server after a clean end
// (evloop.Keeper): the request allowed keep-alive, the exchange did not
// fail, the server is not draining.
func (ls *loopStream) Keep(fd int) bool {
	x := ls.x
	if !ls.keep || x.err != nil || x.clientGone {
		return false
	}
	return listen.ReadmitConn(ls.conn, ls.prefix)
}

// relay is the Relay ls is on its loop: a parkingStream when its kept
// connection may wait for its next request on the loop (parkKept).
func (ls *loopStream) relay() evloop.Relay {
	if ls.keep && parkKept.Load() {
		return parkingStream{ls}
	}
	return ls
}

// parkingStream is a loopStream whose kept client connection waits for its
// next request on the loop (evloop.Parker).
type parkingStream struct{ *loopStream }

// Park leaves the client's connection on the loop after a clean end (the
// conditions of Keep) unless bytes past the request were read already.
func (ps parkingStream) Park(int) evloop.Parked {
	x := ps.x
	if !ps.keep || x.err != nil || x.clientGone {
		return nil
	}
	if p := listen.ParkConn(ps.conn, ps.prefix); p != nil {
		return p
	}
	return nil // not a nil *ParkedConn in the interface
}

// Closed releases the server's hold: the client has the whole stream.
func (ls *loopStream) Closed(error, int64) {
	if ls.stopAt != nil {
		ls.stopAt()
	}
	ls.uncount()
	ls.release()
}

// complete is the exchange's completion for a loop stream (serve's tail on
// the goroutine path): the leg's end, the settle and the access log, then
// the stream's last bytes, then the state's release.
func (ls *loopStream) complete() {
	<-ls.done // Add has returned: ls.h is set
	x := ls.x
	ls.l.close()
	x.complete(false, true) // its sink.End gives the tail to the loop (loopSink.End)
	if ls.framed != nil {
		ls.framed.SetTrailer(ls.sink.trail)
	}
	ls.h.Finish(ls.sink.tail)
	x.h.helpLoops()
}

// loopErr maps the loop's reasons to the pipeline's errors.
func loopErr(err error) error {
	switch {
	case errors.Is(err, evloop.ErrUpstreamCut):
		return errStreamCut
	case errors.Is(err, evloop.ErrIdle):
		return errStreamIdle
	case errors.Is(err, evloop.ErrEventTooLarge):
		return ErrEventTooLarge
	case errors.Is(err, evloop.ErrClientGone), errors.Is(err, evloop.ErrSlowClient):
		return context.Canceled
	case errors.Is(err, evloop.ErrClosed):
		return listen.ErrDraining
	case errors.Is(err, evloop.ErrFailed): // Sluice's failure, not the backend's
		return fmt.Errorf("%w: %w", errLoopFailed, err)
	}
	return err
}

// addErr maps an evloop.Group.Add refusal: closed loops are the drain
// (listen.ErrDraining); failed loops, or sockets the loops could not
// take, are Sluice's failure (errLoopFailed).
func addErr(err error) error {
	if errors.Is(err, evloop.ErrClosed) || errors.Is(err, evloop.ErrFailed) {
		return loopErr(err)
	}
	return fmt.Errorf("%w: %w", errLoopFailed, err)
}

// loopFailed is streamFailed for a loop stream, whose request context no
// longer tells why: err does.
func (x *exchange) loopFailed(l *leg, err error) {
	x.err = err
	switch {
	case errors.Is(err, context.Canceled):
		x.clientGone = true
		return
	case errors.Is(err, errLoopFailed):
		x.logLoopFailed(err) // not the backend's failure: its health is left alone
	case !errors.Is(err, listen.ErrDraining):
		x.logAttempt(x.backend, err)
		l.outcome = routing.Failed // a mid-stream abort counts against the backend
	}
	e := ErrorOf(err)
	x.sent(x.sink.Error(e.Status, x.streamErrorBody(e)))
}

// logLoopFailed logs a stream that the event loops failed or refused
// (errLoopFailed), at error: Sluice's own failure.
func (x *exchange) logLoopFailed(err error) {
	x.h.log.Error("event loop failed under a stream", "request_id", x.id, "trace_id", x.traceID(), "route", x.route.Name,
		"err", err)
}

// loopSink is the Sink of a stream on a loop: events are appended, chunk
// encoded, to the loop's out buffer (set around each call); End leaves the
// stream's tail (the held last event, the last chunk and trailer) for
// Finish.
type loopSink struct {
	hdr     http.Header
	out     []byte
	last    []byte // the last event, held for the trailer (see httpSink.Last)
	tail    []byte
	trailer bool // the client asked for trailers
	// plain: an HTTP/1.0 client; events go out as they are, not
	// chunked, and the stream ends with the connection's close.
	plain bool
	// framed: an HTTP/2 client (handoff_h2.go); events go out as they
	// are (the connection frames them) and End keeps the trailer in
	// trail for the stream's end.
	framed bool
	trail  http.Header
}

var _ Sink = (*loopSink)(nil)

// Header is the head handOff wrote; once the stream is on a loop the head
// is gone (shed) and a fresh header, which nothing sends, is returned.
func (s *loopSink) Header() http.Header {
	if s.hdr == nil {
		s.hdr = http.Header{}
	}
	return s.hdr
}

func (s *loopSink) Start(int, bool) {}

func (s *loopSink) Event(ev, _ []byte) (int, error) {
	if s.plain || s.framed {
		s.out = append(s.out, ev...)
	} else {
		s.out = chunked.AppendChunk(s.out, ev)
	}
	return len(ev), nil
}

func (s *loopSink) Raw(p []byte) (int, error)  { return s.Event(p, nil) }
func (s *loopSink) Body(b []byte) (int, error) { return s.Event(b, nil) }

func (s *loopSink) Error(_ int, body []byte) (int, error) { return s.Event(ErrorEvent(body), nil) }

// Last holds the last event for End (a trailer follows).
func (s *loopSink) Last(ev, _ []byte) (int, error) {
	s.last = append(s.last[:0], ev...)
	return len(ev), nil
}

func (s *loopSink) End(trailer http.Header) {
	if s.framed && s.trailer {
		s.trail = trailer
	}
	if s.plain || s.framed {
		s.tail, s.last = append([]byte(nil), s.last...), nil
		return
	}
	tail := chunked.AppendChunk(nil, s.last)
	if !s.trailer {
		trailer = nil
	}
	s.tail = chunked.AppendLast(tail, trailer)
	s.last = nil
}

// deferredSink ends an exchange whose stream ended with its first event
// (handOff wrote it): End writes the tail and closes the connection.
type deferredSink struct {
	conn net.Conn
	ls   *loopSink
}

func (s *deferredSink) Header() http.Header                 { return s.ls.Header() }
func (s *deferredSink) Start(int, bool)                     {}
func (s *deferredSink) Event(ev, d []byte) (int, error)     { return s.ls.Event(ev, d) }
func (s *deferredSink) Raw(p []byte) (int, error)           { return s.ls.Raw(p) }
func (s *deferredSink) Body(b []byte) (int, error)          { return s.ls.Body(b) }
func (s *deferredSink) Error(st int, b []byte) (int, error) { return s.ls.Error(st, b) }
func (s *deferredSink) End(trailer http.Header) {
	s.ls.End(trailer)
	s.conn.Write(append(s.ls.out, s.ls.tail...))
	s.conn.Close()
}

// discardSink drops everything: the response was written by hand.
type discardSink struct{}

func (discardSink) Header() http.Header               { return http.Header{} }
func (discardSink) Start(int, bool)                   {}
func (discardSink) Event([]byte, []byte) (int, error) { return 0, nil }
func (discardSink) Raw([]byte) (int, error)           { return 0, nil }
func (discardSink) Body([]byte) (int, error)          { return 0, nil }
func (discardSink) Error(int, []byte) (int, error)    { return 0, nil }
func (discardSink) End(http.Header)                   {}
