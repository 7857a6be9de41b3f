package listen

import (
	"cmp"
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

// h3Listener is the QUIC side of the HTTPS listener: a UDP socket, the QUIC
// transport on it, and the HTTP/3 server.
type h3Listener struct {
	udp  *net.UDPConn
	tr   *quic.Transport
	ln   http3.QUICListener
	srv  *http3.Server
	gate *quicGate

	shutdownOnce sync.Once
	drained      chan struct{}      // closed when srv.Shutdown returned
	stopDrain    context.CancelFunc // ends srv.Shutdown's wait
	closeOnce    sync.Once
}

// listenHTTP3 binds the UDP socket and starts QUIC on it; requests are
// served once Serve runs.
func (s *Server) listenHTTP3(addr string, cfg HTTP3Config) (*h3Listener, error) {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return nil, err
	}
	udp := pc.(*net.UDPConn)
	gate := newQUICGate(cfg)
	tr := &quic.Transport{Conn: wrapRawSend(udp), ConnContext: gate.connContext, VerifySourceAddress: gate.verifySource}
	tlsCfg := s.QUICTLSConfig
	if tlsCfg == nil {
		tlsCfg = http3.ConfigureTLSConfig(s.TLSConfig)
	}
	qc := &quic.Config{
		MaxIncomingStreams: cfg.MaxIncomingStreams,
		MaxIdleTimeout:     cfg.IdleTimeout,
		KeepAlivePeriod:    max(cfg.KeepAlive, 0),
		Allow0RTT:          cfg.Allow0RTT,
	}
	var ln http3.QUICListener
	if cfg.Allow0RTT {
		ln, err = tr.ListenEarly(tlsCfg, qc)
	} else {
		ln, err = tr.Listen(tlsCfg, qc) // accepts connections once their handshake is complete
	}
	if err != nil {
		tr.Close()
		udp.Close()
		return nil, err
	}
	q := &h3Listener{udp: udp, tr: tr, ln: ln, gate: gate, drained: make(chan struct{})}
	q.srv = &http3.Server{
		Handler:        h3Handler(s.wrap(ListenerHTTP3, s.Handler)),
		IdleTimeout:    cfg.IdleTimeout,
		MaxHeaderBytes: maxHeaderBytes,
		ConnContext:    s.h3ConnContext,
		Logger:         s.Log,
	}
	return q, nil
}

// quicGate bounds the QUIC connections of one client address and the
// handshakes in progress on the listener. quic-go v0.65.0 has neither
// bound; its Transport.ConnContext (transport.go) may refuse a new
// connection (the client gets CONNECTION_REFUSED) and its context ends
// when the connection closes or its handshake fails, which frees the
// places taken.
type quicGate struct {
	maxPerAddr      int
	maxHsPerAddr    int
	maxHandshakes   int64
	handshaking     atomic.Int64
	mu              sync.Mutex
	conns           map[string]int // client IP -> QUIC connections
	handshakingFrom map[string]int // client IP -> handshakes in progress
}

// Refusals of quicGate (the client sees CONNECTION_REFUSED).
var (
	errQUICConnsPerAddr      = errors.New("too many QUIC connections from this address")
	errQUICHandshakesPerAddr = errors.New("too many QUIC handshakes in progress from this address")
	errQUICHandshakes        = errors.New("too many QUIC handshakes in progress")
)

func newQUICGate(cfg HTTP3Config) *quicGate {
	return &quicGate{
		maxPerAddr:      cmp.Or(max(cfg.MaxConnsPerAddr, 0), DefaultHTTP3ConnsPerAddr),
		maxHsPerAddr:    cmp.Or(max(cfg.MaxHandshakesPerAddr, 0), DefaultHTTP3HandshakesPerAddr),
		maxHandshakes:   int64(cmp.Or(max(cfg.MaxHandshakes, 0), DefaultHTTP3Handshakes)),
		conns:           map[string]int{},
		handshakingFrom: map[string]int{},
	}
}

// connContext is quic.Transport.ConnContext: it takes the connection's
// places (refusing it when a bound is reached) and starts its state when
// its first packet arrives, so the handshake can be timed.
func (g *quicGate) connContext(ctx context.Context, ci *quic.ClientInfo) (context.Context, error) {
	if g.handshaking.Add(1) > g.maxHandshakes {
		g.handshaking.Add(-1)
		return ctx, errQUICHandshakes
	}
	ip := addrIP(ci.RemoteAddr)
	g.mu.Lock()
	var err error
	switch {
	case g.conns[ip] >= g.maxPerAddr:
		err = errQUICConnsPerAddr
	case g.handshakingFrom[ip] >= g.maxHsPerAddr:
		err = errQUICHandshakesPerAddr
	}
	if err != nil {
		g.mu.Unlock()
		g.handshaking.Add(-1)
		return ctx, err
	}
	g.conns[ip]++
	g.handshakingFrom[ip]++
	g.mu.Unlock()
	cs := newConnState(protoH3)
	cs.start = time.Now()
	cs.handshaken = sync.OnceFunc(func() {
		g.handshaking.Add(-1)
		g.mu.Lock()
		decr(g.handshakingFrom, ip)
		g.mu.Unlock()
	})
	context.AfterFunc(ctx, func() {
		cs.handshaken()
		g.mu.Lock()
		decr(g.conns, ip)
		g.mu.Unlock()
	})
	return withConn(ctx, cs), nil
}

// decr counts one off m[k], dropping the key at zero.
func decr(m map[string]int, k string) {
	if m[k]--; m[k] <= 0 {
		delete(m, k)
	}
}

// verifySource is quic.Transport.VerifySourceAddress: once half of the
// handshake bound is in use, new clients must prove their address with a
// Retry before a handshake starts.
func (g *quicGate) verifySource(net.Addr) bool {
	return g.handshaking.Load() >= g.maxHandshakes/2
}

// counts returns the connections held by each client IP and the
// handshakes in progress (for tests).
func (g *quicGate) counts() (map[string]int, int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]int, len(g.conns))
	for ip, n := range g.conns {
		out[ip] = n
	}
	return out, g.handshaking.Load()
}

// h3ConnContext is http3.Server.ConnContext. It completes the connection's
// state and ties its requests to the server's base context, so that
// Shutdown cancels them as it cancels TCP requests.
func (s *Server) h3ConnContext(ctx context.Context, c *quic.Conn) context.Context {
	cs, _ := ctx.Value(connKey{}).(*connState)
	if cs == nil { // not from our transport; keep going without timing
		cs = newConnState(protoH3)
		ctx = withConn(ctx, cs)
	} else {
		cs.handshake = time.Since(cs.start)
		if cs.handshaken != nil {
			s.handshakeDone(c, cs.handshaken)
		}
	}
	cs.quic = c
	ctx = context.WithValue(ctx, serverKey{}, s) // for Hold: a stream on an event loop outlives its handler
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(s.base, func() { cancel(context.Cause(s.base)) })
	context.AfterFunc(ctx, func() { stop() })
	return ctx
}

// handshakeDone frees c's place among the handshakes in progress: now
// when c was accepted after its handshake, or when an early (0-RTT)
// connection's handshake completes or fails.
func (s *Server) handshakeDone(c *quic.Conn, done func()) {
	if c.ConnectionState().TLS.HandshakeComplete {
		done()
		return
	}
	go waitHandshake(c, done)
}

// waitHandshake runs for one early connection, at most until its handshake
// ends (quic-go closes HandshakeComplete on failure too) or it closes.
func waitHandshake(c *quic.Conn, done func()) {
	select {
	case <-c.HandshakeComplete():
	case <-c.Context().Done():
	}
	done()
}

// serve serves HTTP/3 until Shutdown or Close.
func (q *h3Listener) serve() error {
	err := q.srv.ServeListener(q.ln)
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, quic.ErrServerClosed) {
		return nil
	}
	return err
}

// shutdown sends GOAWAY on every connection, stops accepting new ones and
// returns at once; drained is closed when every connection has ended (or
// close was called).
func (q *h3Listener) shutdown() {
	q.shutdownOnce.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		q.stopDrain = cancel
		go q.drain(ctx)
		q.ln.Close()
	})
}

func (q *h3Listener) drain(ctx context.Context) {
	defer close(q.drained)
	q.srv.Shutdown(ctx)
}

// close ends every connection at once and releases the socket.
func (q *h3Listener) close() error {
	var err error
	q.closeOnce.Do(func() {
		q.shutdown()
		q.stopDrain()
		err = q.srv.Close()
		<-q.drained
		q.tr.Close()
		if cerr := q.udp.Close(); err == nil {
			err = cerr
		}
	})
	return err
}

// earlyOK decides a request that arrived in 0-RTT data, before the
// handshake completed: such data can be replayed by an attacker, so only
// GET and HEAD are served (marked "Early-Data: 1" for the backend, RFC
// 8470); anything else is answered 425 Too Early and the client retries
// once the handshake is done.
func (s *Server) earlyOK(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		r.Header.Set("Early-Data", "1")
		return true
	}
	s.Log.Debug("refused a request sent in 0-RTT early data", "status", http.StatusTooEarly,
		"method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusTooEarly)
	w.Write(tooEarlyBody)
	return false
}

// tooEarlyBody is the 425 answer, in OpenAI's error shape like every
// error Sluice sends.
var tooEarlyBody = []byte(`{"error":{"message":"this request arrived in 0-RTT early data, which may be replayed; retry after the handshake","type":"invalid_request_error","param":null,"code":"too_early"}}` + "\n")

// altSvcValue is the Alt-Svc header that advertises HTTP/3 on port.
func altSvcValue(port int) []string {
	v := `h3=":` + strconv.Itoa(port) + `"; ma=` + strconv.Itoa(altSvcMaxAge)
	return []string{v} // len == cap: an append by anyone copies, never shares

}

// udpAddrFor is the UDP address HTTP/3 binds: the configured one, or the
// HTTPS listener's host with the port number it was given.
func udpAddrFor(cfg HTTP3Config, httpsAddr string, bound net.Addr) string {
	if cfg.Addr != "" {
		return cfg.Addr
	}
	host, _, err := net.SplitHostPort(httpsAddr)
	if err != nil {
		host = ""
	}
	return net.JoinHostPort(host, strconv.Itoa(bound.(*net.TCPAddr).Port))
}

func udpPort(c *net.UDPConn) int { return c.LocalAddr().(*net.UDPAddr).Port }
