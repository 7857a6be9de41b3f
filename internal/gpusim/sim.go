package gpusim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Sim is one simulated GPU backend. It is an http.Handler serving the
// OpenAI-compatible API, /health and /metrics; its scheduler goroutine runs
// from New until Close. Several Sims may run in one process: each has its
// own scheduler and its own metrics registry. A Sim is safe for
// simultaneous use by multiple goroutines.
type Sim struct {
	cfg      Config
	metrics  *metrics
	idPrefix string
	ids      atomic.Uint64

	events  chan seqEvent // handlers → scheduler, in order per handler
	closing chan struct{} // closed by Close
	exited  chan struct{} // closed when the scheduler returns
	once    sync.Once

	failMu  sync.Mutex
	failRNG *rand.Rand // FailBeforeFirst draws, guarded by failMu

	// Published by the scheduler, read by Stats, /metrics and headers.
	running, waiting, kvHeld atomic.Int64
	// Request outcomes, counted by the handlers.
	total, completed, cancelled, failed atomic.Int64

	sched scheduler // owned by the scheduler goroutine

	prefix *prefixCache // nil without Config.PrefixCacheBlocks
}

// Stats is a snapshot of a Sim's load and request outcomes.
type Stats struct {
	// Running is the number of sequences in the decode batch.
	Running int
	// Waiting is the number of sequences queued for a batch slot.
	Waiting int
	// Total counts every request received on /v1/chat/completions,
	// /v1/completions and /v1/embeddings, whatever its outcome.
	Total int
	// Completed counts requests answered in full ([DONE] sent, or the
	// whole JSON body written).
	Completed int
	// Cancelled counts requests whose client went away (context done or a
	// failed write) before the answer was complete.
	Cancelled int
	// Failed counts injected faults: fail-before-first 500s and streams
	// aborted by die-after.
	Failed int
}

// New returns a Sim for cfg and starts its scheduler. Zero fields take
// their defaults (Config.WithDefaults); invalid values are clamped to the
// nearest valid one (use Config.Validate to report them instead). Call
// Close to stop the scheduler.
func New(cfg Config) *Sim {
	cfg = cfg.sanitized()
	seed := uint64(cfg.Seed)
	s := &Sim{
		cfg:      cfg,
		idPrefix: fmt.Sprintf("%08x", rand.Uint32()),
		events:   make(chan seqEvent, 256),
		closing:  make(chan struct{}),
		exited:   make(chan struct{}),
		failRNG:  rand.New(rand.NewPCG(seed, seed^0x5f1d)),
	}
	if cfg.PrefixCacheBlocks > 0 {
		s.prefix = newPrefixCache(cfg.PrefixCacheBlocks)
	}
	s.metrics = newMetrics(s)
	s.sched.init(cfg)
	go s.schedule()
	return s
}

// Config returns the Sim's effective configuration (defaults applied).
func (s *Sim) Config() Config { return s.cfg }

// Close stops the scheduler and waits for it to exit. Requests still in
// flight are aborted; new model requests get 503. Close is idempotent.
func (s *Sim) Close() error {
	s.once.Do(func() { close(s.closing) })
	<-s.exited
	return nil
}

// Stats returns a snapshot of the Sim's load and counters.
func (s *Sim) Stats() Stats {
	return Stats{
		Running:   int(s.running.Load()),
		Waiting:   int(s.waiting.Load()),
		Total:     int(s.total.Load()),
		Completed: int(s.completed.Load()),
		Cancelled: int(s.cancelled.Load()),
		Failed:    int(s.failed.Load()),
	}
}

// ServeHTTP serves the OpenAI-compatible API, /health and /metrics.
func (s *Sim) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/chat/completions":
		s.serveModel(w, r, http.MethodPost, s.serveChat)
	case "/v1/completions":
		s.serveModel(w, r, http.MethodPost, s.serveCompletion)
	case "/v1/embeddings":
		s.serveModel(w, r, http.MethodPost, s.serveEmbeddings)
	case "/v1/responses":
		s.serveModel(w, r, http.MethodPost, s.serveResponses)
	case "/v1/messages":
		s.serveModel(w, r, http.MethodPost, s.serveMessages)
	case "/v1/models":
		s.serveModel(w, r, http.MethodGet, s.serveModels)
	case "/health":
		s.serveModel(w, r, http.MethodGet, serveHealth)
	case "/metrics":
		s.metrics.handler.ServeHTTP(w, r)
	default:
		writeError(w, errNotFound(r.URL.Path))
	}
}

// serveModel checks the method and calls h.
func (s *Sim) serveModel(w http.ResponseWriter, r *http.Request, method string, h http.HandlerFunc) {
	if r.Method != method && !(method == http.MethodGet && r.Method == http.MethodHead) {
		w.Header().Set("Allow", method)
		writeError(w, errMethod(r.Method))
		return
	}
	h(w, r)
}

func serveHealth(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok"))
}

// shutdownGrace is how long Serve lets requests in flight finish after its
// context is done, before it closes their connections.
const shutdownGrace = 5 * time.Second

// Serve answers requests on ln with s until ctx is done, then shuts the
// server down (requests in flight get shutdownGrace to finish) and returns
// nil. It speaks HTTP/1.1 and unencrypted HTTP/2 (h2c with prior
// knowledge), as vLLM does. It does not Close s. It returns an error when
// ln fails.
func (s *Sim) Serve(ctx context.Context, ln net.Listener) error {
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second, Protocols: &protocols}
	errc := make(chan error, 1)
	go serveServer(srv, ln, errc)
	select {
	case err := <-errc:
		return fmt.Errorf("serving simulator: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving simulator: %w", err)
	}
	return nil
}

// serveServer runs srv on ln until srv is shut down or closed, then sends
// the outcome on errc.
func serveServer(srv *http.Server, ln net.Listener, errc chan<- error) {
	errc <- srv.Serve(ln)
}

// ListenAndServe validates cfg, listens on the TCP address addr and serves a
// new Sim until ctx is done; then it shuts down and closes the Sim.
func ListenAndServe(ctx context.Context, addr string, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("simulator config: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("simulator listen: %w", err)
	}
	s := New(cfg)
	defer s.Close()
	return s.Serve(ctx, ln)
}
