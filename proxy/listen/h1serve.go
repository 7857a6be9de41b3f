package listen

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Sluice's own HTTP/1.1 server for the cleartext listener (HTTPServerSluice):
// one goroutine per connection parses requests with http.ReadRequest (which
// keeps net/http's request-smuggling checks) on a pooled bufio.Reader and
// answers through a lean ResponseWriter (h1conn.go). Around the parse it
// applies what net/http's server does: the Host rules, 431 past the header
// limit, 400/501/505 with Connection: close, Expect: 100-continue, bounded
// draining of an unread body, pipelining, HTTP/1.0 and Connection rules,
// the header-read and idle timeouts, and a graceful Shutdown. A connection
// that opens with the HTTP/2 preface goes, with the bytes read so far
// replayed, to an http.Server serving h2c through an internal listener.
//
// Client disconnects: once a request's body has been read to its end (or
// it had none), a watcher goroutine reads the connection; an error there
// cancels the request's context (net/http's background read does the
// same). The watcher is not stopped when the handler returns: its read is
// the wait for the next request, and the watcher goes on to serve it, so
// a kept connection costs one goroutine start per request and no aborted
// read.

// HTTP servers of the cleartext listener (Server.HTTPServer).
const (
	HTTPServerGo     = "go"
	HTTPServerSluice = "sluice"
)

// HTTPServerEnv overrides Server.HTTPServer when set (for benchmarks of
// both servers with one configuration, and the tests of both).
const HTTPServerEnv = "SLUICE_HTTP_SERVER"

// ValidHTTPServer reports whether name is a cleartext HTTP server's name
// ("" is the default, HTTPServerSluice).
func ValidHTTPServer(name string) bool {
	return name == "" || name == HTTPServerGo || name == HTTPServerSluice
}

func (s *Server) ownH1() bool {
	name := s.HTTPServer
	if e := os.Getenv(HTTPServerEnv); e != "" {
		name = e
	}
	return name != HTTPServerGo // "" is Sluice's own, the default
}

// httpServer is what Server runs on a listener: an *http.Server or an
// *h1Server.
type httpServer interface {
	Serve(net.Listener) error
	Shutdown(context.Context) error
	Close() error
}

const (
	// h1ReadHeaderTimeout bounds the reading of a request's head.
	h1ReadHeaderTimeout = 10 * time.Second
	// h1DrainMax is how much of a request body the handler left unread the
	// server reads and discards to keep the connection (net/http's
	// maxPostHandlerReadBytes); past it the connection closes.
	h1DrainMax = 256 << 10
	// h1BufSize is the connection's read buffer and the response's body
	// buffer (a response that fits gets a Content-Length).
	h1BufSize = 4 << 10
)

// h1Server serves HTTP/1.1 connections (and hands h2c ones over).
type h1Server struct {
	s       *Server
	handler http.Handler
	idle    time.Duration
	h2      *http.Server // h2c prior knowledge, on h2ln
	h2ln    *chanListener

	mu       sync.Mutex
	ln       net.Listener
	conns    map[*h1Conn]struct{}
	shutting atomic.Bool
	h2once   sync.Once
	h2done   chan error
	// watchDelay is how long after a request's body ended the watcher
	// starts if the handler still runs (zero: at once).
	watchDelay time.Duration
	// headTimeout bounds the reading of a request's head
	// (h1ReadHeaderTimeout; tests shorten it).
	headTimeout time.Duration
	// connBase is the connections' context: the server's base without its
	// cancellation. A request's context (readRequest) derives from it, so
	// that it is not registered with the one context every request of the
	// node shares — a mutex and a map write at each request's start and
	// again at its end, on every core. The base's cancellation reaches the
	// running requests through stopRequests instead (net/http's server
	// likewise derives its requests from a context per connection).
	connBase context.Context
	// stopped: the base was cancelled; a request that starts after it is
	// cancelled at once (readRequest).
	stopped atomic.Bool
}

// h1WatchDelay is h1Server.watchDelay's default; SLUICE_H1_WATCH_DELAY
// (a duration) overrides it, for the benchmarks of both ways. It bounds
// how late a client's close is noticed while its handler runs. A started
// watcher costs a goroutine (the timer's), its stack's growth to the
// handler's depth and a hand-over of the connection: under target 3's
// load a small request waits several milliseconds for its backend, so
// 1 ms (h1own) started one for nearly every request (docs/BENCHMARKS.md,
// "smallreq5").
const h1WatchDelay = 100 * time.Millisecond

func (s *Server) newH1Server(h http.Handler) *h1Server {
	hs := &h1Server{
		s:           s,
		handler:     s.wrap(ListenerHTTP, h),
		idle:        s.idleTimeout(),
		h2:          s.newServer(ListenerHTTP, h),
		conns:       map[*h1Conn]struct{}{},
		h2done:      make(chan error, 1),
		watchDelay:  h1WatchDelay,
		headTimeout: h1ReadHeaderTimeout,
	}
	if d, err := time.ParseDuration(os.Getenv("SLUICE_H1_WATCH_DELAY")); err == nil {
		hs.watchDelay = d
	}
	hs.connBase = context.WithoutCancel(s.base)
	context.AfterFunc(s.base, hs.stopRequests)
	return hs
}

// stopRequests cancels the running requests' contexts with the base's
// cause (ErrDraining), as if they derived from the base: the server's drain
// deadline passed, or Close. A hijacked request has its own watch on the
// base (Hijack).
func (hs *h1Server) stopRequests() {
	cause := context.Cause(hs.s.base)
	hs.stopped.Store(true) // before the visits: a request that starts after its visit sees it
	hs.mu.Lock()
	defer hs.mu.Unlock()
	for c := range hs.conns {
		c.wmu.Lock()
		if c.running {
			c.cancel(cause)
		}
		c.wmu.Unlock()
	}
}

func (s *Server) idleTimeout() time.Duration {
	if s.IdleTimeout > 0 {
		return s.IdleTimeout
	}
	return DefaultIdleTimeout
}

// Serve accepts connections from ln until Shutdown or Close.
func (hs *h1Server) Serve(ln net.Listener) error {
	hs.mu.Lock()
	hs.ln = ln
	hs.h2ln = &chanListener{addr: ln.Addr(), ch: make(chan net.Conn), done: make(chan struct{})}
	hs.mu.Unlock()
	go func() { hs.h2done <- hs.h2.Serve(hs.h2ln) }()
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if hs.shutting.Load() {
				return http.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				// Out of descriptors and the like: wait, as net/http does.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		hs.serveConn(c)
	}
}

// serveConn starts serving c on a goroutine of its own (the listener's
// Accept, or a re-admission directly).
func (hs *h1Server) serveConn(c net.Conn) {
	hc := hs.newConn(c)
	if hc == nil {
		return
	}
	go hc.serve()
}

func (hs *h1Server) newConn(c net.Conn) *h1Conn {
	hc := &h1Conn{srv: hs, rwc: c, wake: make(chan struct{}, 1)}
	hc.state.Store(connIdle)
	hs.mu.Lock()
	if hs.shutting.Load() {
		hs.mu.Unlock()
		c.Close()
		return nil
	}
	hs.conns[hc] = struct{}{}
	hs.mu.Unlock()
	return hc
}

func (hs *h1Server) forget(c *h1Conn) {
	hs.mu.Lock()
	delete(hs.conns, c)
	hs.mu.Unlock()
}

// handH2 gives a connection that opened with the HTTP/2 preface to the h2c
// server; buffered are the bytes read from it so far.
func (hs *h1Server) handH2(c net.Conn, buffered []byte) {
	rc := &replayConn{Conn: c, prefix: bytes.Clone(buffered)}
	select {
	case hs.h2ln.ch <- rc:
	case <-hs.h2ln.done:
		c.Close()
	}
}

// Shutdown stops accepting, closes idle connections at once and waits for
// the active ones to finish their request (they close after it), and for
// the h2c server's, until ctx is done. It may be called again.
func (hs *h1Server) Shutdown(ctx context.Context) error {
	hs.shutting.Store(true)
	hs.closeListener()
	h2err := make(chan error, 1)
	go func() { h2err <- hs.h2.Shutdown(ctx) }()
	wait := time.Millisecond
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		if hs.closeIdle() {
			break
		}
		select {
		case <-ctx.Done():
			<-h2err
			return ctx.Err()
		case <-t.C:
			wait = min(2*wait, 50*time.Millisecond)
			t.Reset(wait)
		}
	}
	return <-h2err
}

// Close closes the listener and every connection at once.
func (hs *h1Server) Close() error {
	hs.shutting.Store(true)
	if hs.s.base.Err() != nil {
		hs.stopRequests() // now, before the connections are forgotten (the base's AfterFunc may come later)
	}
	err := hs.closeListener()
	hs.mu.Lock()
	for c := range hs.conns {
		c.rwc.Close()
	}
	hs.conns = map[*h1Conn]struct{}{}
	hs.mu.Unlock()
	hs.h2.Close()
	return err
}

func (hs *h1Server) closeListener() error {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	var err error
	if hs.ln != nil {
		err = hs.ln.Close()
		hs.ln = nil
	}
	if hs.h2ln != nil {
		hs.h2ln.close()
	}
	return err
}

// closeIdle closes the connections that wait for a request and reports
// whether none is left.
func (hs *h1Server) closeIdle() bool {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	for c := range hs.conns {
		if c.state.Load() == connIdle {
			c.state.Store(connClosed)
			c.rwc.Close()
			delete(hs.conns, c)
		}
	}
	return len(hs.conns) == 0
}

// chanListener is the h2c server's listener: its Accept returns the
// connections the h1 server hands over.
type chanListener struct {
	addr net.Addr
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) close()         { l.once.Do(func() { close(l.done) }) }
func (l *chanListener) Close() error   { l.close(); return nil }
func (l *chanListener) Addr() net.Addr { return l.addr }

// replayConn is a connection whose first bytes were read already: Read
// returns them first. NetConn finds the counted connection under it
// (capConnOf, ConnContext).
type replayConn struct {
	net.Conn
	prefix []byte
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

func (c *replayConn) NetConn() net.Conn { return c.Conn }

func (c *replayConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, syscall.EINVAL
}

// limitReader reads at most remain more bytes from r (io.EOF after them).
// Under the connection's read buffer, remain bounds the bytes a request's
// head may take (MaxHeaderBytes and the buffer's slack, as net/http counts
// them); lengthBody is one over the buffer.
type limitReader struct {
	r      io.Reader
	remain int64
}

func (r *limitReader) Read(p []byte) (int, error) {
	if r.remain <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > r.remain {
		p = p[:r.remain]
	}
	n, err := r.r.Read(p)
	r.remain -= int64(n)
	return n, err
}
