package routing

import (
	"errors"
	"math/rand/v2"
	"net/url"
	"sync/atomic"
	"time"
)

// ErrNoHealthyBackend means every backend of the pool is ejected, at its
// concurrency cap, or already tried for this request.
var ErrNoHealthyBackend = errors.New("no healthy backend")

// Backend is one backend server. Its counters are safe for simultaneous use
// by multiple goroutines.
type Backend struct {
	// URL is the backend's base URL.
	URL *url.URL
	// Config is the backend's configuration.
	Config BackendConfig

	pool         *Pool
	inflight     atomic.Int64
	failures     atomic.Int32 // consecutive
	ejections    atomic.Int32 // consecutive, for backoff
	ejectedUntil atomic.Int64 // unix nanoseconds
}

// InFlight is the number of this node's requests the backend is serving.
func (b *Backend) InFlight() int64 { return b.inflight.Load() }

// Healthy reports whether the backend is not ejected at t.
func (b *Backend) Healthy(t time.Time) bool { return t.UnixNano() >= b.ejectedUntil.Load() }

// Begin counts a request to the backend; call the returned function once
// when the response body is finished (not when headers arrive).
func (b *Backend) Begin() (end func()) {
	b.inflight.Add(1)
	var done atomic.Bool
	return func() {
		if done.CompareAndSwap(false, true) {
			b.inflight.Add(-1)
		}
	}
}

// Report records the outcome of a request for passive health: ok false for
// a connect error or a 5xx. Consecutive failures eject the backend with
// exponential backoff; a success resets both counts.
func (b *Backend) Report(ok bool, t time.Time) {
	if ok {
		b.failures.Store(0)
		b.ejections.Store(0)
		return
	}
	if int(b.failures.Add(1)) < b.pool.cfg.EjectAfter {
		return
	}
	b.failures.Store(0)
	n := min(b.ejections.Add(1)-1, 4)
	b.ejectedUntil.Store(t.Add(b.pool.cfg.EjectFor << n).UnixNano())
}

// Pool is a named group of backends.
type Pool struct {
	cfg      PoolConfig
	backends []*Backend
}

// NewPool builds a pool. The config must have been validated.
func NewPool(cfg PoolConfig) (*Pool, error) {
	cfg = cfg.WithDefaults()
	p := &Pool{cfg: cfg}
	for _, bc := range cfg.Backends {
		u, err := url.Parse(bc.URL)
		if err != nil {
			return nil, err
		}
		p.backends = append(p.backends, &Backend{URL: u, Config: bc, pool: p})
	}
	return p, nil
}

// Name is the pool's name.
func (p *Pool) Name() string { return p.cfg.Name }

// Config is the pool's configuration with defaults applied.
func (p *Pool) Config() PoolConfig { return p.cfg }

// Backends lists the pool's backends.
func (p *Pool) Backends() []*Backend { return p.backends }

// Pick chooses a backend by power of two choices on in-flight requests
// (scaled by weight) among healthy backends under their concurrency cap,
// skipping those in tried.
func (p *Pool) Pick(tried []*Backend) (*Backend, error) {
	now := time.Now()
	var a, b *Backend
	n := 0
	for _, c := range p.backends {
		if !c.Healthy(now) || isTried(tried, c) ||
			(c.Config.MaxConcurrency > 0 && c.InFlight() >= int64(c.Config.MaxConcurrency)) {
			continue
		}
		// Reservoir-sample two distinct candidates in one pass.
		n++
		switch {
		case n == 1:
			a = c
		case n == 2:
			b = c
		default:
			if i := rand.IntN(n); i == 0 {
				a = c
			} else if i == 1 {
				b = c
			}
		}
	}
	switch {
	case a == nil:
		return nil, ErrNoHealthyBackend
	case b == nil:
		return a, nil
	}
	la, lb := a.InFlight()*int64(b.Config.Weight), b.InFlight()*int64(a.Config.Weight)
	if lb < la || (lb == la && rand.IntN(2) == 0) {
		return b, nil
	}
	return a, nil
}

func isTried(tried []*Backend, b *Backend) bool {
	for _, t := range tried {
		if t == b {
			return true
		}
	}
	return false
}
