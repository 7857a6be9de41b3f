package listen

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// ErrDraining is the cause with which a Server cancels the contexts of the
// requests still running when its drain timeout ends (see Shutdown).
var ErrDraining = errors.New("server is shutting down")

// Server serves a handler on Sluice's listeners: cleartext HTTP/1.1 and
// h2c, TLS HTTP/1.1 and HTTP/2, HTTP/3 over QUIC on the HTTPS port, and the
// admin listener. Configure the exported fields, then call Listen, Serve
// and, to stop, Shutdown.
type Server struct {
	// Handler serves the proxy listeners.
	Handler http.Handler
	// HTTPAddr is the cleartext listener (HTTP/1.1 and h2c). Empty: none.
	HTTPAddr string
	// HTTPSAddr is the TLS listener. Empty: none. TLSConfig must be set.
	HTTPSAddr string
	// TLSConfig serves the TLS listener; it must offer ALPN "h2" and
	// "http/1.1".
	TLSConfig *tls.Config
	// HTTP3 configures HTTP/3 beside the TLS listener; the zero value
	// serves it over UDP on the TLS listener's port number.
	HTTP3 HTTP3Config
	// QUICTLSConfig serves HTTP/3 (TLS 1.3, ALPN "h3"). Nil means
	// TLSConfig prepared with http3.ConfigureTLSConfig.
	QUICTLSConfig *tls.Config
	// AdminAddr serves Admin. Empty: none.
	AdminAddr string
	Admin     http.Handler
	// MaxConnsPerAddr caps the TCP connections one client IP address may
	// hold on each proxy listener; more are closed at once. Zero means
	// DefaultMaxConnsPerAddr.
	MaxConnsPerAddr int
	// FirstRequestTimeout closes a TCP connection (h1 or h2) that has
	// not started a request this long after it was accepted. Zero means
	// DefaultFirstRequestTimeout.
	FirstRequestTimeout time.Duration
	// IdleTimeout closes a TCP connection (h1 keep-alive or h2) that has
	// served requests and has had none open for this long. Zero means
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// HTTPProxyProtocol and HTTPSProxyProtocol turn on the PROXY protocol
	// (v1 and v2) on the cleartext and TLS listeners (see proxyproto.go).
	HTTPProxyProtocol  ProxyProtocol
	HTTPSProxyProtocol ProxyProtocol
	// TrustedProxies are the peers (L7 load balancers) whose ClientHeader
	// names the client (see clientaddr.go). Empty: none; the peer is the
	// client.
	TrustedProxies []netip.Prefix
	// ClientHeader is the header trusted proxies name the client in:
	// HeaderXForwardedFor (default) or HeaderForwarded.
	ClientHeader string
	// HTTPServer serves HTTP/1.1 on the cleartext listener:
	// HTTPServerSluice (h1serve.go, the default; also "") or HTTPServerGo
	// (net/http's). The environment's SLUICE_HTTP_SERVER overrides it.
	HTTPServer string
	// Log receives server errors. Nil means slog.Default().
	Log *slog.Logger
	// H2Server picks the HTTP/2 server of the TCP listeners (h2 over TLS
	// and h2c with prior knowledge): H2ServerSluice (Sluice's own,
	// h2conn.go; also "") or H2ServerGo (net/http's).
	H2Server string

	h2limits *h2Limits // tests: the limits of H2ServerSluice (nil: defaults)

	servers  []httpServer
	lns      []net.Listener
	kinds    []string
	h3       *h3Listener
	altSvc   []string // Alt-Svc of TLS responses; nil without HTTP/3
	udpHint  string
	base     context.Context
	stopBase context.CancelCauseFunc
	active   sync.WaitGroup
	running  atomic.Int64 // handlers running now (active, readable)
	draining atomic.Bool
	idle     chan struct{} // a token when running drops to zero while draining
	drainCh  chan struct{} // closed when Shutdown begins
	drainMu  sync.Once
	readmit  []*readmitListener // the cleartext HTTP listener's
}

// Addr kinds for Server.Addr.
const (
	ListenerHTTP  = "http"
	ListenerHTTPS = "https"
	ListenerHTTP3 = "http3" // a UDP address
	ListenerAdmin = "admin"
)

const (
	maxHeaderBytes   = 64 << 10
	handshakeTimeout = 10 * time.Second
	// h3CloseGrace is how long Shutdown waits, after the last handler
	// returned, for HTTP/3 clients to read their final bytes and close.
	h3CloseGrace = 500 * time.Millisecond
	// tcpCloseGrace is how long Shutdown waits, after the last handler
	// returned, for TCP connections to deliver their final bytes and end
	// (see finishConns): past the one second after which an h2 server
	// closes a connection whose streams have all ended after a GOAWAY.
	tcpCloseGrace = 1500 * time.Millisecond
	// portTries bounds the attempts to find a port number free on both
	// TCP and UDP when the HTTPS address asks for any port (":0").
	portTries = 8
)

// Listen binds every configured listener, or none: an address that cannot
// be bound, TCP or UDP, is a start-up error naming it.
func (s *Server) Listen() error {
	if s.Log == nil {
		s.Log = slog.Default()
	}
	s.drainCh = make(chan struct{})
	s.idle = make(chan struct{}, 1)
	base := context.WithValue(context.Background(), drainKey{}, (<-chan struct{})(s.drainCh))
	base = context.WithValue(base, serverKey{}, s) // for Hold (hold.go)
	s.base, s.stopBase = context.WithCancelCause(base)
	err := s.listen()
	if err != nil {
		s.closeListeners()
	}
	return err
}

func (s *Server) listen() error {
	if s.HTTPAddr != "" {
		ln, err := net.Listen("tcp", s.HTTPAddr)
		if err != nil {
			return fmt.Errorf("listening on %s (%s): %w", s.HTTPAddr, ListenerHTTP, err)
		}
		if ln, err = s.proxyProtocol(ln, ListenerHTTP, s.HTTPProxyProtocol); err != nil {
			return err
		}
		rl := newReadmitListener(s.capListener(ln))
		rl.idle = s.idleTimeout()
		s.readmit = append(s.readmit, rl)
		if s.ownH1() {
			hs := s.newH1Server(s.Handler)
			rl.serve = hs.serveConn // re-admitted connections skip Accept
			s.addServer(ListenerHTTP, rl, hs)
		} else {
			s.add(ListenerHTTP, rl, s.Handler)
		}
	}
	if s.HTTPSAddr != "" {
		if err := s.listenHTTPS(); err != nil {
			return err
		}
	}
	if s.AdminAddr != "" {
		ln, err := net.Listen("tcp", s.AdminAddr)
		if err != nil {
			return fmt.Errorf("listening on %s (%s): %w", s.AdminAddr, ListenerAdmin, err)
		}
		s.add(ListenerAdmin, ln, s.Admin)
	}
	return nil
}

// listenHTTPS binds the TLS listener and, unless disabled, the UDP socket
// for HTTP/3 on the same port number.
func (s *Server) listenHTTPS() error {
	if s.TLSConfig == nil {
		return errors.New("https listener needs a TLS config")
	}
	cfg := s.HTTP3.WithDefaults()
	for try := 1; ; try++ {
		ln, err := net.Listen("tcp", s.HTTPSAddr)
		if err != nil {
			return fmt.Errorf("listening on %s (%s): %w", s.HTTPSAddr, ListenerHTTPS, err)
		}
		if cfg.On() {
			addr := udpAddrFor(cfg, s.HTTPSAddr, ln.Addr())
			q, err := s.listenHTTP3(addr, cfg)
			if err != nil {
				ln.Close()
				if anyPort(s.HTTPSAddr) && cfg.Addr == "" && try < portTries {
					continue // the TCP port's number is taken on UDP; try another
				}
				return fmt.Errorf("listening on udp %s (%s): %w", addr, ListenerHTTP3, err)
			}
			s.h3 = q
			s.altSvc = altSvcValue(udpPort(q.udp))
			s.udpHint = udpBufferHint(q.udp)
			if s.udpHint != "" {
				s.Log.Warn("UDP buffers too small for QUIC", "hint", s.udpHint)
			}
		}
		var pln net.Listener = ln
		if pln, err = s.proxyProtocol(ln, ListenerHTTPS, s.HTTPSProxyProtocol); err != nil {
			return err
		}
		s.add(ListenerHTTPS, newTLSListener(s.capListener(pln), s.TLSConfig, handshakeTimeout, s.Log), s.Handler)
		return nil
	}
}

// proxyProtocol puts the PROXY protocol's header reader in front of ln
// when p is enabled: the per-address cap (after it) then counts the
// clients the headers name, not the balancer.
func (s *Server) proxyProtocol(ln net.Listener, kind string, p ProxyProtocol) (net.Listener, error) {
	if !p.Enabled {
		return ln, nil
	}
	allowed, err := p.Prefixes()
	if err == nil && len(allowed) == 0 {
		err = errors.New("allowed_cidrs is empty")
	}
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("%s listener's proxy_protocol: %w", kind, err)
	}
	return newProxyListener(ln, allowed, cmp.Or(s.FirstRequestTimeout, DefaultFirstRequestTimeout), s.Log), nil
}

// capListener bounds the connections per client address; those of
// trusted proxies are not counted (one carries many clients).
func (s *Server) capListener(ln net.Listener) *capListener {
	cl := newCapListener(ln, s.MaxConnsPerAddr, s.FirstRequestTimeout)
	cl.exempt = s.TrustedProxies
	return cl
}

func anyPort(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	return err == nil && (port == "0" || port == "")
}

func (s *Server) add(kind string, ln net.Listener, h http.Handler) {
	s.addServer(kind, ln, s.newServer(kind, h))
}

func (s *Server) addServer(kind string, ln net.Listener, srv httpServer) {
	s.lns = append(s.lns, ln)
	s.servers = append(s.servers, srv)
	s.kinds = append(s.kinds, kind)
}

func (s *Server) newServer(kind string, h http.Handler) *http.Server {
	var protos http.Protocols
	protos.SetHTTP1(true)
	switch kind {
	case ListenerHTTP:
		protos.SetUnencryptedHTTP2(true)
	case ListenerHTTPS:
		protos.SetHTTP2(true)
	}
	srv := &http.Server{
		Handler:           s.wrap(kind, h),
		Protocols:         &protos,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       cmp.Or(s.IdleTimeout, DefaultIdleTimeout),
		MaxHeaderBytes:    maxHeaderBytes,
		BaseContext:       func(net.Listener) context.Context { return s.base },
		ErrorLog:          slog.NewLogLogger(s.Log.Handler(), slog.LevelDebug),
	}
	if kind != ListenerAdmin {
		srv.ConnContext = ConnContext
	}
	if kind != ListenerAdmin && s.H2Server != H2ServerGo {
		s.newH2Server().install(srv)
	}
	return srv
}

// wrap runs around the handler of every proxy listener: it counts running
// handlers (so Shutdown can wait for cancelled ones), notes the
// connection's facts for ConnInfo, advertises HTTP/3 on TLS responses and,
// on HTTP/3 with 0-RTT on, refuses unsafe early requests.
func (s *Server) wrap(kind string, h http.Handler) http.Handler {
	if kind == ListenerAdmin {
		return h
	}
	var altSvc []string
	if kind == ListenerHTTPS {
		altSvc = s.altSvc
	}
	early := kind == ListenerHTTP3 && s.HTTP3.Allow0RTT
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.active.Add(1)
		s.running.Add(1)
		defer func() { s.handlerDone(); s.active.Done() }()
		r = noteRequest(r)
		s.realClient(r)
		if altSvc != nil {
			w.Header()["Alt-Svc"] = altSvc
		}
		if early && r.TLS != nil && !r.TLS.HandshakeComplete && !s.earlyOK(w, r) {
			return
		}
		h.ServeHTTP(w, r)
	})
}

// UDPBufferHint is a hint for the operator when the kernel's UDP buffers
// are smaller than QUIC needs (with the sysctl commands that fix it), or
// "" when they are large enough or HTTP/3 is off. Valid after Listen.
func (s *Server) UDPBufferHint() string { return s.udpHint }

// Addr returns the bound address of a listener kind, or "".
func (s *Server) Addr(kind string) string {
	if kind == ListenerHTTP3 {
		if s.h3 == nil {
			return ""
		}
		return s.h3.udp.LocalAddr().String()
	}
	for i, k := range s.kinds {
		if k == kind {
			return s.lns[i].Addr().String()
		}
	}
	return ""
}

// Serve serves every listener until Shutdown; it returns the first error
// other than http.ErrServerClosed.
func (s *Server) Serve() error {
	n := len(s.servers)
	errc := make(chan error, n+1)
	for i, srv := range s.servers {
		go func(srv httpServer, ln net.Listener) {
			err := srv.Serve(ln)
			if errors.Is(err, http.ErrServerClosed) {
				err = nil
			}
			errc <- err
		}(srv, s.lns[i])
	}
	if s.h3 != nil {
		n++
		go func() { errc <- s.h3.serve() }()
	}
	var first error
	for range n {
		if err := <-errc; err != nil && first == nil {
			first = err
			go s.Close()
		}
	}
	return first
}

// Draining reports whether Shutdown has begun.
func (s *Server) Draining() bool { return s.draining.Load() }

// Shutdown stops accepting connections (HTTP/3 clients get GOAWAY) and lets
// running requests finish until ctx is done; then it cancels the rest
// (streams end with an error event saying the node is shutting down) and
// closes everything.
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	s.drainMu.Do(func() { close(s.drainCh) })
	for _, rl := range s.readmit {
		rl.drain() // idle kept-alive connections close at once
	}
	var h3drained <-chan struct{}
	if s.h3 != nil {
		s.h3.shutdown()
		h3drained = s.h3.drained
	}
	var wg sync.WaitGroup
	for _, srv := range s.servers {
		wg.Add(1)
		go func(srv httpServer) {
			defer wg.Done()
			srv.Shutdown(ctx)
		}(srv)
	}
	wg.Wait()
	if s.h3 != nil {
		s.waitRequests(ctx, h3drained)
	}
	// Hijacked connections (WebSocket) are not tracked by http.Server:
	// their handlers drain on the drain signal and may run until ctx ends.
	s.waitHandlers(ctx)
	s.stopBase(ErrDraining)
	done := make(chan struct{})
	go func() { s.active.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		s.Log.Warn("handlers still running 5s after cancel; closing connections")
	}
	s.finishConns()
	if s.h3 != nil {
		// The cancelled streams' last events are on their way; give
		// clients a moment to read them and close after the GOAWAY.
		t := time.NewTimer(h3CloseGrace)
		select {
		case <-h3drained:
		case <-t.C:
		}
		t.Stop()
	}
	return s.Close()
}

// finishConns lets the TCP connections end gracefully once the handlers
// have returned: a returned handler's last bytes (the shutting_down error
// event, h1's last chunk, h2's END_STREAM) may still wait in the
// connection's writer, and closing the connection under them cuts the
// stream with a transport error (an h2 client reports the GOAWAY it got
// at the start of the drain). Shutdown again waits, up to tcpCloseGrace,
// for h1 connections to go idle (then closes them) and for h2 connections
// to close after their GOAWAY (the client closes once its streams ended;
// the server closes one second after its last stream ended).
func (s *Server) finishConns() {
	ctx, cancel := context.WithTimeout(context.Background(), tcpCloseGrace)
	defer cancel()
	var wg sync.WaitGroup
	for _, srv := range s.servers {
		wg.Go(func() { srv.Shutdown(ctx) })
	}
	wg.Wait()
}

// handlerDone counts a handler out; the last one out during a drain wakes
// the waiter. Shutdown sets draining before it reads running, so either
// it sees the count at zero or the last handler sees draining and leaves a
// token in idle (a stale token only makes the waiter look again).
func (s *Server) handlerDone() {
	if s.running.Add(-1) == 0 && s.draining.Load() {
		select {
		case s.idle <- struct{}{}:
		default: // a token is already waiting
		}
	}
}

// waitHandlers waits until no handler runs or ctx is done.
func (s *Server) waitHandlers(ctx context.Context) {
	s.waitIdle(ctx, nil)
}

// waitIdle waits until no handler runs, or ctx is done, or stop (nil:
// never) is closed. Shutdown has set draining.
func (s *Server) waitIdle(ctx context.Context, stop <-chan struct{}) {
	for s.running.Load() > 0 {
		select {
		case <-s.idle:
		case <-stop:
			return
		case <-ctx.Done():
			return
		}
	}
}

// drainKey carries the server's drain signal in every request's context.
type drainKey struct{}

// DrainSignal returns a channel closed when the server serving ctx begins
// to shut down, or nil (never closed) outside a Server.
func DrainSignal(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(drainKey{}).(<-chan struct{})
	return ch
}

// waitRequests waits, after the TCP servers shut down, until the HTTP/3
// connections have all ended, or no request runs any more (a client may
// keep an idle connection open after GOAWAY; Close ends it), or ctx is done.
func (s *Server) waitRequests(ctx context.Context, h3drained <-chan struct{}) {
	s.waitIdle(ctx, h3drained)
}

// Close closes every listener and connection at once.
func (s *Server) Close() error {
	if s.stopBase != nil {
		s.stopBase(ErrDraining)
	}
	var errs []error
	for _, srv := range s.servers {
		if err := srv.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if s.h3 != nil {
		if err := s.h3.close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s *Server) closeListeners() {
	for _, ln := range s.lns {
		ln.Close()
	}
	if s.h3 != nil {
		s.h3.close()
	}
	s.lns, s.servers, s.kinds, s.h3, s.altSvc, s.readmit = nil, nil, nil, nil, nil, nil
}
