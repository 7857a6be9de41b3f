package routing

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ErrNoHealthyBackend means every backend of the pool is ejected, at its
// concurrency cap, or already tried for this request. Errors for an
// unavailable pool match it with errors.Is and carry a retry delay (see
// RetryAfter).
var ErrNoHealthyBackend = errors.New("no healthy backend")

// unavailableError is ErrNoHealthyBackend with the time until the first
// ejected backend may be back.
type unavailableError struct{ retryAfter time.Duration }

func (e *unavailableError) Error() string             { return ErrNoHealthyBackend.Error() }
func (e *unavailableError) Is(target error) bool      { return target == ErrNoHealthyBackend }
func (e *unavailableError) RetryAfter() time.Duration { return e.retryAfter }

// RetryAfter returns how long a client should wait before retrying after
// err, when err says (a pool that is unavailable or whose queue is full or
// timed out); otherwise 0.
func RetryAfter(err error) time.Duration {
	var ra interface{ RetryAfter() time.Duration }
	if errors.As(err, &ra) {
		return ra.RetryAfter()
	}
	return 0
}

// Backend is one backend server. Its counters are safe for simultaneous use
// by multiple goroutines.
type Backend struct {
	// URL is the backend's base URL.
	URL *url.URL
	// Config is the backend's configuration, with defaults applied.
	Config BackendConfig

	pool       *Pool
	label      string // host[/path], for metrics
	metricsURL string
	healthURL  string

	inflight     atomic.Int64
	failures     atomic.Int32 // consecutive
	ejections    atomic.Int32 // consecutive, for backoff
	ejectedUntil atomic.Int64 // unix nanoseconds
	probeDown    atomic.Bool
	progressAt   atomic.Int64             // unix nanoseconds of the last answer or event seen
	failLoad     atomic.Pointer[failLoad] // decaying penalty of recent failures

	// loadFormat is the endpoint-load-metrics-format request header's
	// value for this backend ("TEXT", "JSON"), empty for none.
	loadFormat string

	// affID is the backend's id in the pool's prefix table (0: none);
	// hrw is its rendezvous hash for session affinity (affinity.go).
	affID uint16
	hrw   uint64

	pred predictor // TTFT prediction means and error histogram (predict.go)

	scraped atomic.Pointer[Sample]
	header  atomic.Pointer[Sample]

	// Counted for metrics.
	passiveEjections, probeEjections, scrapeErrors, probeFailures atomic.Int64
	// probeExcused counts probes that timed out while the backend was
	// still answering requests (not counted as failures).
	probeExcused atomic.Int64
}

// progressGrain is how often Progress stores a new time: calls closer
// together than this only read it.
const progressGrain = 50 * time.Millisecond

// progress records that the backend answered a request or sent a stream
// event at t. A health probe that times out while the backend keeps making
// progress is not held against it: a backend busy streaming to many
// clients may answer its probes late. Cheap enough to call on every event.
func (b *Backend) progress(t time.Time) {
	if n := t.UnixNano(); n-b.progressAt.Load() >= int64(progressGrain) {
		b.progressAt.Store(n)
	}
}

// InFlight is the number of this node's requests the backend is serving.
func (b *Backend) InFlight() int64 { return b.inflight.Load() }

// Healthy reports whether the backend is in rotation at t: not ejected by
// passive health and not failing its active probes.
func (b *Backend) Healthy(t time.Time) bool {
	return !b.probeDown.Load() && t.UnixNano() >= b.ejectedUntil.Load()
}

// begin counts a request to the backend until end.
func (b *Backend) begin() { b.inflight.Add(1) }

// end ends a request begun with begin; it wakes the pool's admission
// queue.
func (b *Backend) end() {
	b.inflight.Add(-1)
	b.pool.queue.signal()
}

// report records the outcome of a request for passive health: ok false for
// a connect error or a 5xx. Consecutive failures eject the backend with
// exponential backoff; a success resets both counts.
func (b *Backend) report(ok bool, t time.Time) {
	if ok {
		b.progress(t)
		b.failures.Store(0)
		b.ejections.Store(0)
		return
	}
	b.addFailLoad(t)
	if int(b.failures.Add(1)) < b.pool.cfg.EjectAfter {
		return
	}
	b.failures.Store(0)
	n := min(b.ejections.Add(1)-1, 4)
	b.ejectedUntil.Store(t.Add(b.pool.cfg.EjectFor << n).UnixNano())
	b.passiveEjections.Add(1)
}

// observeLoadHeader records an endpoint-load-metrics response header (ORCA
// TEXT or JSON form) received at t as a fresh load sample. A partial report
// is completed from the fresh scrape and this node's in-flight count (see
// complete). Values it cannot read are ignored.
func (b *Backend) observeLoadHeader(v string, t time.Time) {
	s, ok := parseLoadHeader(v)
	if !ok {
		return
	}
	s.At, s.inflight = t, b.inflight.Load()
	b.complete(&s, t, s.inflight)
	b.header.Store(&s)
	b.pool.queue.signal()
}

// loadFormat is the endpoint-load-metrics-format value for a backend of
// dialect d in a pool whose load_header_format is f.
func loadFormat(f, d string) string {
	switch f {
	case LoadHeaderText:
		return "TEXT"
	case LoadHeaderJSON:
		return "JSON"
	case LoadHeaderAuto:
		if d != DialectSGLang && d != DialectTGI {
			return "TEXT"
		}
	}
	return ""
}

// LoadHeaderFormat is the value of the endpoint-load-metrics-format
// header to send with each request to the backend ("TEXT" or "JSON"), or
// "" to send none. It asks an engine that supports ORCA load reports
// (vLLM v0.11 and later) to attach an endpoint-load-metrics header to its
// response, which Attempt.Observe reads.
func (b *Backend) LoadHeaderFormat() string { return b.loadFormat }

// Pool is a named group of backends with their load signals, health and
// admission queue. Start runs its scrapers and probes; Close stops them.
// It is safe for simultaneous use by multiple goroutines.
type Pool struct {
	cfg      PoolConfig
	backends []*Backend
	sel      Selector
	queue    *queue
	client   *http.Client
	cands    sync.Pool // *[]*Backend scratch for Pick
	aff      *affinity // prefix and session affinity (affinity.go)

	objRefused atomic.Int64 // requests refused by a TTFT objective (predict.go)

	mu      sync.Mutex
	stop    context.CancelFunc
	started bool
	closed  bool
	wg      sync.WaitGroup
}

// NewPool builds a pool. The config must have been validated; an invalid
// URL or policy is an error.
func NewPool(cfg PoolConfig) (*Pool, error) {
	cfg = cfg.WithDefaults()
	sel, err := NewSelector(cfg.Policy)
	if err != nil {
		return nil, fmt.Errorf("pool %q: %w", cfg.Name, err)
	}
	p := &Pool{cfg: cfg, sel: sel, client: newProbeClient()}
	p.cands.New = func() any { s := make([]*Backend, 0, len(cfg.Backends)); return &s }
	for _, bc := range cfg.Backends {
		u, err := url.Parse(bc.URL)
		if err != nil {
			return nil, fmt.Errorf("pool %q: backend url: %w", cfg.Name, err)
		}
		base := strings.TrimSuffix(bc.URL, "/")
		b := &Backend{URL: u, Config: bc, pool: p, metricsURL: bc.MetricsURL, healthURL: base + cfg.Health.Path,
			label: u.Host + strings.TrimSuffix(u.Path, "/")}
		b.loadFormat = loadFormat(cfg.LoadHeaderFormat, bc.Dialect)
		if b.metricsURL == "" {
			b.metricsURL = base + "/metrics"
		}
		p.backends = append(p.backends, b)
	}
	p.queue = newQueue(p)
	p.aff = newAffinity(cfg)
	p.bindAffinity()
	return p, nil
}

// UseTransport makes the pool's scrapes and health probes use rt's
// settings (for instance those of the transport that carries its requests:
// the pool's upstream TLS and HTTP/2 choice). An *http.Transport is cloned
// with a small idle pool of its own, so probes and scrapes never share
// connections, or wait, with the requests: a backend holding thousands of
// streams still gets its probes on a connection of their own. Other round
// trippers are used as they are, except those with a StdTransport method,
// whose net/http transport is cloned. Call it before Start. By default probes
// and scrapes use a plain HTTP client of their own.
func (p *Pool) UseTransport(rt http.RoundTripper) {
	if s, ok := rt.(interface{ StdTransport() *http.Transport }); ok {
		rt = s.StdTransport() // a wrapper (proxy.PoolTransport): probe with its net/http side's settings
	}
	if t, ok := rt.(*http.Transport); ok {
		t = t.Clone()
		t.MaxIdleConns, t.MaxIdleConnsPerHost, t.MaxConnsPerHost = 0, probeIdleConns, 0
		t.IdleConnTimeout = probeIdleTimeout
		t.ReadBufferSize, t.WriteBufferSize = 0, 0 // the defaults (4 KiB)
		rt = t
	}
	p.client = &http.Client{Transport: rt}
}

// Name is the pool's name.
func (p *Pool) Name() string { return p.cfg.Name }

// Config is the pool's configuration with defaults applied.
func (p *Pool) Config() PoolConfig { return p.cfg }

// Backends lists the pool's backends.
func (p *Pool) Backends() []*Backend { return p.backends }

// pick chooses a backend with the pool's policy among healthy backends
// under their concurrency cap, skipping those in tried. When the admission
// queue has targets, backends below target are preferred. With no backend
// healthy it returns an error matching ErrNoHealthyBackend with a retry
// delay (RetryAfter).
func (p *Pool) pick(tried []*Backend) (*Backend, error) { return p.pickFor(tried, nil) }

// pickFor is pick for the request want describes (its prompt and session
// key steer the choice: see Pool.choose); want may be nil.
func (p *Pool) pickFor(tried []*Backend, want *Want) (*Backend, error) {
	now := time.Now()
	bufp := p.cands.Get().(*[]*Backend)
	defer p.cands.Put(bufp)
	cands, healthy := (*bufp)[:0], 0
	for _, c := range p.backends {
		if !c.Healthy(now) {
			continue
		}
		healthy++
		if isTried(tried, c) || c.atCap() {
			continue
		}
		cands = append(cands, c)
	}
	*bufp = cands
	switch {
	case len(cands) == 0 && healthy == 0:
		return nil, &unavailableError{retryAfter: p.nextHealthy(now)}
	case len(cands) == 0:
		return nil, ErrNoHealthyBackend
	}
	if p.queue.enabled {
		cands = p.queue.preferRoom(cands, now)
	}
	if len(cands) == 1 {
		return cands[0], nil
	}
	return p.choose(cands, now, want), nil
}

func (b *Backend) atCap() bool {
	return b.Config.MaxConcurrency > 0 && b.inflight.Load() >= int64(b.Config.MaxConcurrency)
}

func isTried(tried []*Backend, b *Backend) bool {
	for _, t := range tried {
		if t == b {
			return true
		}
	}
	return false
}

// nextHealthy estimates when the first unhealthy backend returns: the end
// of the shortest ejection, or one probe interval for a probe failure. At
// least one second.
func (p *Pool) nextHealthy(now time.Time) time.Duration {
	d := time.Duration(math.MaxInt64)
	for _, b := range p.backends {
		if b.probeDown.Load() {
			d = min(d, p.cfg.Health.Interval)
		} else if until := time.Unix(0, b.ejectedUntil.Load()); until.After(now) {
			d = min(d, until.Sub(now))
		}
	}
	return max(d, time.Second)
}

// anyHealthy reports whether some backend is in rotation at now.
func (p *Pool) anyHealthy(now time.Time) bool {
	for _, b := range p.backends {
		if b.Healthy(now) {
			return true
		}
	}
	return false
}

// Start runs the pool's metric scrapers and health probes, one goroutine
// per backend and kind, until ctx is done or Close is called. Calling it
// again, or after Close, does nothing.
func (p *Pool) Start(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started || p.closed {
		return
	}
	p.started = true
	ctx, p.stop = context.WithCancel(ctx)
	for _, b := range p.backends {
		if b.Config.Dialect != DialectNone {
			p.wg.Add(1)
			go p.scrapeLoop(ctx, b)
		}
		if !p.cfg.Health.Disable {
			p.wg.Add(1)
			go p.probeLoop(ctx, b)
		}
	}
}

// Close stops the scrapers and probes and waits for them to exit. Requests
// waiting in the admission queue keep waiting for capacity (in-flight
// requests still end and wake them) or their deadline. Close is
// idempotent.
func (p *Pool) Close() error {
	p.mu.Lock()
	p.closed = true
	stop := p.stop
	p.mu.Unlock()
	if stop != nil {
		stop()
	}
	p.wg.Wait()
	if p.aff.shared != nil {
		p.aff.shared.close()
	}
	p.queue.close()
	p.client.CloseIdleConnections()
	return nil
}
