package listen

import (
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"syscall"
	"time"

	"github.com/sluice-proxy/sluice/proxy/internal/rawsock"
)

// tlsListener accepts TCP connections and completes each TLS handshake in
// its own goroutine before handing the connection to the HTTP server, so
// that the handshake can be timed (net/http would otherwise do it lazily,
// out of sight). Slow handshakes do not hold up others; each is bounded by
// timeout, and Close aborts those still running.
type tlsListener struct {
	prepListener
	cfg     *tls.Config
	timeout time.Duration
	log     *slog.Logger
}

// handshakenConn is the TCP connection under a *tls.Conn that tlsListener
// returned; it carries the connection's state to ConnContext. The TLS
// records are read and written through the raw socket under Conn (sock,
// rawSockOf: no entersyscall per call, as on the cleartext listener);
// sock is nil when raw calls are off or Conn has no socket of ours, and
// Conn's own Read and Write serve then.
type handshakenConn struct {
	net.Conn
	cs   *connState
	sock *rawsock.Conn
}

func (c *handshakenConn) Read(p []byte) (int, error) {
	if c.sock != nil {
		return c.sock.Read(p)
	}
	return c.Conn.Read(p)
}

func (c *handshakenConn) Write(p []byte) (int, error) {
	if c.sock != nil {
		return c.sock.Write(p)
	}
	return c.Conn.Write(p)
}

func newTLSListener(inner net.Listener, cfg *tls.Config, timeout time.Duration, log *slog.Logger) *tlsListener {
	l := &tlsListener{cfg: cfg, timeout: timeout, log: log}
	l.prepare = l.handshake
	l.start(inner)
	return l
}

// handshake completes one TLS handshake: the connection to hand on, or
// nil when it failed (raw is closed).
func (l *tlsListener) handshake(raw net.Conn, accepted time.Time) net.Conn {
	cs := newConnState(protoH1)
	if sc, ok := raw.(syscall.Conn); ok {
		cs.raw, _ = sc.SyscallConn()
	}
	tc := tls.Server(&handshakenConn{Conn: raw, cs: cs, sock: rawSockOf(raw)}, l.cfg)
	if l.timeout > 0 {
		raw.SetDeadline(accepted.Add(l.timeout))
	}
	if err := tc.HandshakeContext(l.ctx); err != nil {
		l.handshakeFailed(raw, err)
		return nil
	}
	raw.SetDeadline(time.Time{})
	cs.handshake = time.Since(accepted)
	if tc.ConnectionState().NegotiatedProtocol == "h2" {
		cs.proto.Store(protoH2)
	}
	return tc
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
