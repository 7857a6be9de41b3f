package listen

import (
	"context"
	"net"
	"sync"
	"syscall"
	"time"
)

// Re-admission: an HTTP/1.1 connection whose stream the event loops
// relayed (hijacked, its socket taken out of Go's netpoller) goes back to
// the HTTP server when the stream ended cleanly and the request allowed
// keep-alive: Readmit rebuilds a net.Conn from the loop's descriptor and
// the cleartext listener's Accept returns it again, so the server serves
// the client's next request on it as on a new connection.
//
// The connection keeps the original's identity:
//   - its addresses (a PROXY protocol header's client address included):
//     the original's RemoteAddr and LocalAddr;
//   - its count against the client address's cap: handed over from the
//     original (counted once while open, released once when closed);
//   - connection info (ConnContext): made anew, as for any accepted
//     connection (cleartext: no handshake; the RTT is read from the same
//     socket);
//   - idleness: it waits for its next request like a new connection, with
//     the first-request timeout (and the server's ReadHeaderTimeout), not
//     IdleTimeout;
//   - the drain: Shutdown closes re-admitted connections that have not
//     started a request yet (the idle keep-alive connections net/http
//     closes at once), and refuses new ones.

// readmitBacklog bounds the connections waiting for Accept.
const readmitBacklog = 256

// readmitListener is the cleartext HTTP listener's outermost wrapper: its
// Accept returns the connections of the listener under it and the
// re-admitted ones. The inner listener's Accept runs on a goroutine of its
// own (started by the first Accept; it ends when Close is called).
type readmitListener struct {
	net.Listener
	acc   chan accepted
	re    chan net.Conn
	done  chan struct{}
	start sync.Once
	stop  sync.Once

	mu     sync.Mutex
	closed bool                     // draining or closed: Readmit refuses
	fresh  map[*capConn]struct{}    // re-admitted, no request started yet
	parked map[*ParkedConn]struct{} // kept on an event loop (ParkConn)
	// serve, when set (the h1 server, h1serve.go), serves a re-admitted
	// connection at once instead of queueing it for Accept.
	serve func(net.Conn)
	// idle bounds a kept connection's wait for its next request on an
	// event loop (ParkConn): the server's idle_timeout.
	idle time.Duration
}

type accepted struct {
	c   net.Conn
	err error
}

func newReadmitListener(cl *capListener) *readmitListener {
	l := &readmitListener{Listener: cl, acc: make(chan accepted), re: make(chan net.Conn, readmitBacklog),
		done: make(chan struct{}), fresh: map[*capConn]struct{}{}, parked: map[*ParkedConn]struct{}{}}
	cl.re = l
	return l
}

func (l *readmitListener) Accept() (net.Conn, error) {
	l.start.Do(func() { go l.pump() })
	select {
	case c := <-l.re:
		return c, nil
	case a := <-l.acc:
		return a.c, a.err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// pump accepts from the inner listener until Close.
func (l *readmitListener) pump() {
	for {
		c, err := l.Listener.Accept()
		select {
		case l.acc <- accepted{c, err}:
		case <-l.done:
			if c != nil {
				c.Close()
			}
			return
		}
	}
}

// Close closes the inner listener and every re-admitted connection not
// yet accepted or not yet serving a request.
func (l *readmitListener) Close() error {
	l.stop.Do(func() { close(l.done) })
	l.drain()
	return l.Listener.Close()
}

// drain refuses re-admissions from now on and closes the re-admitted
// connections that wait for a request (Shutdown calls it first).
func (l *readmitListener) drain() {
	l.mu.Lock()
	l.closed = true
	fresh := l.fresh
	l.fresh = map[*capConn]struct{}{}
	parked := l.parked
	l.parked = map[*ParkedConn]struct{}{}
	for p := range parked {
		p.closeAsked = true
	}
	l.mu.Unlock()
	for c := range fresh {
		c.Close()
	}
	for p := range parked {
		if p.closer != nil {
			p.closer() // the loop closes it
		}
	}
	for {
		select {
		case c := <-l.re:
			c.Close()
		default:
			return
		}
	}
}

// served takes c out of the fresh set: a request started on it.
func (l *readmitListener) served(c *capConn) {
	l.mu.Lock()
	delete(l.fresh, c)
	l.mu.Unlock()
}

// ReadmitConn gives a hijacked connection whose socket stayed open under
// it (the event loops keep it under its net.Conn) back to the server that
// accepted it: orig itself, with nothing rebuilt; prefix is the bytes the
// client sent after its request that were read already (its next request;
// the connection's Read returns them first). It reports whether it took
// orig over; when it did not (orig came from no cleartext listener of
// this package's Server, or the server is draining), orig is the caller's
// to close. After it did, orig's Close does nothing.
func ReadmitConn(orig net.Conn, prefix []byte) bool {
	cc, l := openReadmitter(orig)
	if l == nil || orig != net.Conn(cc) {
		return false
	}
	l.admit(cc, retire(orig, cc, prefix))
	return true
}

// ReadmitConn's preparation: orig goes over to a successor connection.
func retire(orig net.Conn, cc *capConn, prefix []byte) *keptConn {
	cc.retired.Store(true)
	cc.timer.Stop()
	inner := cc.Conn
	if kc, ok := inner.(*keptConn); ok {
		// Re-admitted before: no wrapper per stream on a long-lived
		// connection. What its replay still holds follows prefix (which
		// the server read from it earlier).
		inner = kc.Conn
		if len(kc.prefix) > 0 {
			prefix = append(prefix[:len(prefix):len(prefix)], kc.prefix...)
		}
	}
	// The server may have left deadlines on the socket (its timeouts);
	// the next request sets its own.
	inner.SetDeadline(time.Time{})
	return &keptConn{Conn: inner, remote: orig.RemoteAddr(), local: orig.LocalAddr(), prefix: prefix}
}

// ParkedConn is a kept client connection waiting for its next request on
// an event loop (evloop.Parked): ParkConn made it, the loop's Wake
// re-admits it to the server (served at once by Sluice's own HTTP/1.1
// server, queued for Accept by net/http's), its Close closes it. While
// parked it counts against its address's cap once, and the server's
// drain asks the loop to close it.
type ParkedConn struct {
	l    *readmitListener
	c    *capConn
	idle time.Duration
	// Under l.mu:
	closer     func()
	closeAsked bool
}

// ParkConn is ReadmitConn for a connection whose socket stays on the
// event loop until its next request arrives: it returns nil when orig
// cannot go back to its server (as ReadmitConn's false) or when bytes
// past the request were read already (prefix: served at once by
// ReadmitConn instead), and unless Sluice's own HTTP/1.1 server serves
// the listener (it serves a woken connection at once). After it returned non-nil, orig's Close does
// nothing and the ParkedConn owns the socket.
func ParkConn(orig net.Conn, prefix []byte) *ParkedConn {
	cc, l := openReadmitter(orig)
	if l == nil || orig != net.Conn(cc) || len(prefix) > 0 {
		return nil
	}
	if kc, ok := cc.Conn.(*keptConn); ok && len(kc.prefix) > 0 {
		return nil
	}
	p := &ParkedConn{l: l, idle: l.idle}
	l.mu.Lock()
	if l.closed || l.serve == nil || l.idle <= 0 {
		l.mu.Unlock()
		return nil
	}
	p.c = successor(cc, retire(orig, cc, nil), l)
	l.parked[p] = struct{}{}
	l.mu.Unlock()
	return p
}

// Idle is the connection's idle bound on the loop: the listener's
// idle_timeout, as for any kept connection.
func (p *ParkedConn) Idle() time.Duration { return p.idle }

// SetCloser takes the function that asks the loop to close p (the
// drain's).
func (p *ParkedConn) SetCloser(f func()) {
	p.l.mu.Lock()
	p.closer = f
	asked := p.closeAsked
	p.l.mu.Unlock()
	if asked {
		f()
	}
}

// Wake re-admits p: its client sent its next request.
func (p *ParkedConn) Wake() {
	if !p.unpark() {
		p.c.Close() // the drain came first
		return
	}
	p.l.admitConn(p.c)
}

// Close closes p's socket and releases its count.
func (p *ParkedConn) Close() {
	p.unpark()
	p.c.Close()
}

func (p *ParkedConn) unpark() bool {
	p.l.mu.Lock()
	defer p.l.mu.Unlock()
	_, ok := p.l.parked[p]
	delete(p.l.parked, p)
	return ok && !p.l.closed
}

// admit queues kc, the socket of cc, for Accept as a new connection (or
// closes it when the server is draining or the backlog is full).
func (l *readmitListener) admit(cc *capConn, kc *keptConn) {
	l.admitConn(successor(cc, kc, l))
}

// successor is the counted connection kc, the socket of cc, goes on as.
func successor(cc *capConn, kc *keptConn, l *readmitListener) *capConn {
	c := &capConn{Conn: kc, l: cc.l, ip: cc.ip, re: l, timer: stoppedTimer}
	// The count goes over to the new connection: the original's release
	// (KeepCounted) finds nothing left to release.
	c.counted.Store(cc.counted.Swap(false))
	return c
}

// stoppedTimer is a parked connection's first-request timer until its
// Wake arms one (its Close stops it).
var stoppedTimer = func() *time.Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}()

// admitConn is admit's second half.
func (l *readmitListener) admitConn(c *capConn) {
	c.timer = newFirstTimer(c, c.l.first)
	l.mu.Lock()
	if !l.closed && l.serve != nil {
		l.fresh[c] = struct{}{}
		l.mu.Unlock()
		l.serve(c)
		return
	}
	if !l.closed {
		select {
		case l.re <- c:
			l.fresh[c] = struct{}{}
			l.mu.Unlock()
			return
		default: // the backlog is full
		}
	}
	l.mu.Unlock()
	c.Close()
}

// CanReadmit reports whether Readmit may take c's socket when its
// hijacked stream ends: c came from a cleartext listener of a Server that
// is not draining.
func CanReadmit(c net.Conn) bool {
	_, l := openReadmitter(c)
	return l != nil
}

// openReadmitter returns c's counted connection and its server's
// re-admitting listener, or nils when c came from no cleartext listener
// of a Server or that server is draining.
func openReadmitter(c net.Conn) (*capConn, *readmitListener) {
	cc := capConnOf(c)
	if cc == nil || cc.l.re == nil {
		return nil, nil
	}
	l := cc.l.re
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return nil, nil
	}
	return cc, l
}

// keptConn is a re-admitted socket with its original connection's
// addresses.
type keptConn struct {
	net.Conn
	remote, local net.Addr
	prefix        []byte // read before the socket
}

func (c *keptConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

func (c *keptConn) RemoteAddr() net.Addr { return c.remote }
func (c *keptConn) LocalAddr() net.Addr  { return c.local }

// SyscallConn exposes the socket (RTT readings, the event loops).
func (c *keptConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, syscall.EINVAL
}

// EarlySocket returns the socket of the cleartext TCP connection ctx's
// request arrived on (ctx is the request's context), so that a handler
// about to hijack it can write its response's first bytes before
// Hijack, and whether CanReadmit will hold for the hijacked connection
// (it may still be refused later: the server may start draining). Nil
// when the request came through no TCP listener of this package (the
// caller then writes after Hijack). The caller must not use it on TLS
// connections: it is the TCP socket under them.
func EarlySocket(ctx context.Context) (syscall.RawConn, bool) {
	cs, _ := ctx.Value(connKey{}).(*connState)
	if cs == nil || cs.raw == nil || cs.quic != nil {
		return nil, false
	}
	if cs.cap == nil {
		return cs.raw, false
	}
	_, l := openReadmitter(cs.cap)
	return cs.raw, l != nil
}
