package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Server serves a handler on Sluice's TCP listeners: cleartext HTTP/1.1 and
// h2c, TLS HTTP/1.1 and HTTP/2, and the admin listener. Configure the
// exported fields, then call Listen, Serve and, to stop, Shutdown.
type Server struct {
	// Handler serves the proxy listeners.
	Handler http.Handler
	// HTTPAddr is the cleartext listener (HTTP/1.1 and h2c). Empty: none.
	HTTPAddr string
	// HTTPSAddr is the TLS listener. Empty: none. TLSConfig must be set.
	HTTPSAddr string
	TLSConfig *tls.Config
	// AdminAddr serves Admin. Empty: none.
	AdminAddr string
	Admin     http.Handler
	// Log receives server errors. Nil means slog.Default().
	Log *slog.Logger

	servers  []*http.Server
	lns      []net.Listener
	kinds    []string
	base     context.Context
	stopBase context.CancelCauseFunc
	active   sync.WaitGroup
	draining atomic.Bool
	drainCh  chan struct{} // closed when Shutdown begins
	drainMu  sync.Once
}

// Addr kinds for Server.Addr.
const (
	ListenerHTTP  = "http"
	ListenerHTTPS = "https"
	ListenerAdmin = "admin"
)

// Listen binds every configured listener, or none: an address that cannot
// be bound is a start-up error naming it.
func (s *Server) Listen() error {
	if s.Log == nil {
		s.Log = slog.Default()
	}
	s.drainCh = make(chan struct{})
	base := context.WithValue(context.Background(), drainKey{}, (<-chan struct{})(s.drainCh))
	s.base, s.stopBase = context.WithCancelCause(base)
	type want struct {
		kind, addr string
		h          http.Handler
	}
	wants := []want{{ListenerHTTP, s.HTTPAddr, s.Handler}, {ListenerHTTPS, s.HTTPSAddr, s.Handler}, {ListenerAdmin, s.AdminAddr, s.Admin}}
	for _, w := range wants {
		if w.addr == "" {
			continue
		}
		ln, err := net.Listen("tcp", w.addr)
		if err != nil {
			s.closeListeners()
			return fmt.Errorf("listening on %s (%s): %w", w.addr, w.kind, err)
		}
		srv := s.newServer(w.kind, w.h)
		if w.kind == ListenerHTTPS {
			if s.TLSConfig == nil {
				ln.Close()
				s.closeListeners()
				return errors.New("https listener needs a TLS config")
			}
			ln = tls.NewListener(ln, s.TLSConfig)
		}
		s.lns = append(s.lns, ln)
		s.servers = append(s.servers, srv)
		s.kinds = append(s.kinds, w.kind)
	}
	return nil
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
	if kind != ListenerAdmin {
		h = s.track(h)
	}
	return &http.Server{
		Handler:           h,
		Protocols:         &protos,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return s.base },
		ErrorLog:          slog.NewLogLogger(s.Log.Handler(), slog.LevelDebug),
	}
}

// track counts running handlers so Shutdown can wait for cancelled ones.
func (s *Server) track(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.active.Add(1)
		defer s.active.Done()
		h.ServeHTTP(w, r)
	})
}

// Addr returns the bound address of a listener kind, or "".
func (s *Server) Addr(kind string) string {
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
	errc := make(chan error, len(s.servers))
	for i, srv := range s.servers {
		go func(srv *http.Server, ln net.Listener) {
			err := srv.Serve(ln)
			if errors.Is(err, http.ErrServerClosed) {
				err = nil
			}
			errc <- err
		}(srv, s.lns[i])
	}
	var first error
	for range s.servers {
		if err := <-errc; err != nil && first == nil {
			first = err
			go s.Close()
		}
	}
	return first
}

// Draining reports whether Shutdown has begun.
func (s *Server) Draining() bool { return s.draining.Load() }

// Shutdown stops accepting connections and lets running requests finish
// until ctx is done; then it cancels the rest (streams end with an error
// event saying the node is shutting down) and closes everything.
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	s.drainMu.Do(func() { close(s.drainCh) })
	var wg sync.WaitGroup
	for _, srv := range s.servers {
		wg.Add(1)
		go func(srv *http.Server) {
			defer wg.Done()
			srv.Shutdown(ctx)
		}(srv)
	}
	wg.Wait()
	// Hijacked connections (WebSocket) are not tracked by http.Server:
	// their handlers drain on the drain signal and may run until ctx ends.
	s.waitActive(ctx)
	s.stopBase(errDraining)
	done := make(chan struct{})
	go func() { s.active.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		s.Log.Warn("handlers still running 5s after cancel; closing connections")
	}
	return s.Close()
}

// waitActive waits until no handler runs or ctx is done.
func (s *Server) waitActive(ctx context.Context) {
	done := make(chan struct{})
	go func() { s.active.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// drainKey carries the server's drain signal in every request's context.
type drainKey struct{}

// drainSignal returns a channel closed when the server serving ctx begins
// to shut down, or nil (never closed) outside a Server.
func drainSignal(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(drainKey{}).(<-chan struct{})
	return ch
}

// Close closes every listener and connection at once.
func (s *Server) Close() error {
	if s.stopBase != nil {
		s.stopBase(errDraining)
	}
	var errs []error
	for _, srv := range s.servers {
		if err := srv.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s *Server) closeListeners() {
	for _, ln := range s.lns {
		ln.Close()
	}
	s.lns, s.servers, s.kinds = nil, nil, nil
}
