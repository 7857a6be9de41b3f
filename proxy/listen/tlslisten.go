package listen

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"
)

// tlsListener accepts TCP connections and completes each TLS handshake in
// its own goroutine before handing the connection to the HTTP server, so
// that the handshake can be timed (net/http would otherwise do it lazily,
// out of sight). Slow handshakes do not hold up others; each is bounded by
// timeout, and Close aborts those still running.
type tlsListener struct {
	inner   net.Listener
	cfg     *tls.Config
	timeout time.Duration
	log     *slog.Logger

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	conns  chan net.Conn
	errs   chan error
	once   sync.Once
	loop   sync.WaitGroup
}

// handshakenConn is the TCP connection under a *tls.Conn that tlsListener
// returned; it carries the connection's state to ConnContext.
type handshakenConn struct {
	net.Conn
	cs *connState
}

func newTLSListener(inner net.Listener, cfg *tls.Config, timeout time.Duration, log *slog.Logger) *tlsListener {
	ctx, cancel := context.WithCancel(context.Background())
	l := &tlsListener{
		inner: inner, cfg: cfg, timeout: timeout, log: log,
		ctx: ctx, cancel: cancel, conns: make(chan net.Conn), errs: make(chan error),
	}
	l.loop.Add(1)
	go l.acceptLoop()
	return l
}

// Accept returns the next connection whose handshake is complete.
func (l *tlsListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case err := <-l.errs:
		return nil, err
	case <-l.ctx.Done():
		return nil, net.ErrClosed
	}
}

// Close stops accepting and aborts handshakes in progress. Connections
// already returned by Accept are not affected.
func (l *tlsListener) Close() error {
	var err error
	l.once.Do(func() {
		l.cancel()
		err = l.inner.Close()
		l.loop.Wait()
	})
	return err
}

func (l *tlsListener) Addr() net.Addr { return l.inner.Addr() }

// acceptLoop accepts TCP connections until the listener is closed. Accept
// errors are passed to the server (which backs off on temporary ones).
func (l *tlsListener) acceptLoop() {
	defer l.loop.Done()
	for {
		c, err := l.inner.Accept()
		if err != nil {
			select {
			case l.errs <- err:
			case <-l.ctx.Done():
				return
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		go l.handshake(c, time.Now())
	}
}

// handshake completes one TLS handshake and queues the connection.
func (l *tlsListener) handshake(raw net.Conn, accepted time.Time) {
	cs := newConnState(protoH1)
	if sc, ok := raw.(syscall.Conn); ok {
		cs.raw, _ = sc.SyscallConn()
	}
	tc := tls.Server(&handshakenConn{Conn: raw, cs: cs}, l.cfg)
	if l.timeout > 0 {
		raw.SetDeadline(accepted.Add(l.timeout))
	}
	if err := tc.HandshakeContext(l.ctx); err != nil {
		l.handshakeFailed(raw, err)
		return
	}
	raw.SetDeadline(time.Time{})
	cs.handshake = time.Since(accepted)
	if tc.ConnectionState().NegotiatedProtocol == "h2" {
		cs.proto.Store(protoH2)
	}
	select {
	case l.conns <- tc:
	case <-l.ctx.Done():
		tc.Close()
	}
}

// handshakeFailed logs a failed handshake the way net/http does, answering
// a client that spoke plain HTTP to the TLS port with a 400.
func (l *tlsListener) handshakeFailed(raw net.Conn, err error) {
	defer raw.Close()
	var re tls.RecordHeaderError
	if errors.As(err, &re) && re.Conn != nil && looksLikeHTTP(re.RecordHeader) {
		io.WriteString(re.Conn, "HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
		err = errors.New("client sent an HTTP request to an HTTPS server")
	}
	if l.ctx.Err() == nil {
		l.log.Debug("tls handshake failed", "remote", raw.RemoteAddr().String(), "err", err)
	}
}

func looksLikeHTTP(hdr [5]byte) bool {
	switch string(hdr[:]) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO":
		return true
	}
	return false
}
