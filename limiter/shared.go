package limiter

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// SharedOptions configure a Shared limiter. Zero fields take the defaults
// noted.
type SharedOptions struct {
	// AdmissionTimeout bounds one admission in Redis: a slow store is
	// waited for (a burst queues on the connection pool), and only an
	// admission without an answer within it is decided by the
	// store-failure policy. Redis refuses to run an admission that reaches
	// it after this deadline (checked on Redis TIME), so a late one never
	// takes a lease. Zero means 500ms.
	AdmissionTimeout time.Duration
	// SettleTimeout bounds one settle in Redis (a failed settle is retried
	// by the heartbeat). Zero means 250ms.
	SettleTimeout time.Duration
	// FailureThreshold is the number of consecutive store failures or
	// timeouts that open the circuit breaker. Zero means 3.
	FailureThreshold int
	// Cooldown is how long the breaker stays open before one probe
	// admission is sent to the store again. Zero means 1s.
	Cooldown time.Duration
	// Nodes is the expected number of edge nodes: under the local policy
	// each node enforces 1/Nodes of every limit. Zero means the number of
	// live nodes seen by the heartbeat (1 before the first beat).
	Nodes int
	// Registerer receives the limiter's metrics. Nil means none.
	Registerer prometheus.Registerer
	// Logger logs breaker transitions. Nil means slog.Default().
	Logger *slog.Logger
}

func (o SharedOptions) withDefaults() SharedOptions {
	if o.AdmissionTimeout <= 0 {
		o.AdmissionTimeout = 500 * time.Millisecond
	}
	if o.SettleTimeout <= 0 {
		o.SettleTimeout = 250 * time.Millisecond
	}
	if o.FailureThreshold <= 0 {
		o.FailureThreshold = 3
	}
	if o.Cooldown <= 0 {
		o.Cooldown = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Shared is the limiter for edge nodes sharing limits through Redis:
//
//   - a local first line answers without Redis where it can: a deny cache
//     (a tenant refused by Redis until T is refused locally until T) and a
//     local ceiling (a Local with the full limits counting only this node's
//     requests: what this node alone exceeds, all nodes together exceed);
//   - otherwise one admission script on Redis, bounded by AdmissionTimeout
//     (a slow store is waited for, not bypassed: a fallback decision while
//     Redis still grants leases would add to them);
//   - when Redis fails or gives no answer in time, and while the circuit
//     breaker is open, the tenant's OnStoreFailure policy: "local" (a Local
//     enforcing this node's share 1/N of every limit, counting the leases
//     this node still holds in Redis), "open" (admit) or "closed" (refuse
//     with Reason "store"; the caller answers 503). Such decisions have
//     Degraded set and are counted in sluice_limiter_degraded_total.
//
// Redis coming back closes the breaker after one successful probe; tickets
// admitted locally settle locally. Shared is safe for simultaneous use by
// multiple goroutines.
type Shared struct {
	store    *Redis
	ceiling  *Local // this node's own use against the full limits
	fallback *Local // this node's share, used while degraded
	opt      SharedOptions
	deny     denyCache
	br       *breaker
	m        *metrics
	closer   func() error
	now      func() time.Time
	warm     atomic.Bool // NewFromConfig's warm-up reached Redis
}

// sharedTicket is the state of a Ticket issued by Shared.
type sharedTicket struct {
	ceiling *Ticket // the local ceiling's charge
	inner   *Ticket // the store's or the fallback's ticket; nil under "open"
}

var _ Limiter = (*Shared)(nil)

// NewShared returns a Shared limiter on store.
func NewShared(store *Redis, opt SharedOptions) *Shared {
	opt = opt.withDefaults()
	s := &Shared{store: store, ceiling: NewLocal(1), fallback: NewLocal(1), opt: opt,
		m: newMetrics(opt.Registerer), now: time.Now}
	s.br = &breaker{threshold: opt.FailureThreshold, cooldown: opt.Cooldown, onChange: s.breakerChanged}
	return s
}

func (s *Shared) breakerChanged(open bool) {
	if open {
		s.m.breakerOpen.Set(1)
		s.opt.Logger.Warn("limiter: shared store failing, using the store-failure policies",
			"threshold", s.opt.FailureThreshold, "cooldown", s.opt.Cooldown)
		return
	}
	s.m.breakerOpen.Set(0)
	s.opt.Logger.Info("limiter: shared store back")
}

// Warm reports whether the warm-up at start (NewFromConfig) reached Redis:
// its connections were opened and its scripts loaded. False when Redis
// was down then (the node started anyway, under the store-failure
// policies), or for a Shared not made by NewFromConfig.
func (s *Shared) Warm() bool { return s.warm.Load() }

// Store returns the Redis limiter behind s.
func (s *Shared) Store() *Redis { return s.store }

// Degraded reports whether the breaker currently keeps admissions away from
// the store.
func (s *Shared) Degraded() bool { return s.br.isOpen() }

// Share is the fraction of every limit this node enforces under the local
// policy.
func (s *Shared) Share() float64 {
	n := s.opt.Nodes
	if n <= 0 {
		n = s.store.Nodes()
	}
	return 1 / float64(max(n, 1))
}

// Admit decides whether req may start. It returns an error only when ctx
// ends first.
func (s *Shared) Admit(ctx context.Context, req Request) (Decision, error) {
	now := s.now()
	p := newPlan(req, 1)
	if p.enforce {
		if d, ok := s.deny.check(req, p, now); ok {
			s.m.denyHit.Inc()
			return d, nil
		}
	}
	cd := s.ceiling.AdmitAt(now, req)
	if !cd.Allowed {
		s.m.ceilingRefused.Inc()
		return cd, nil
	}
	if !s.br.allow(now) {
		return s.degraded(req, p, cd.Ticket, now), nil
	}
	if req.ID == "" {
		req.ID = randomID() // needed to abandon a timed-out admission
	}
	actx, cancel := context.WithTimeout(ctx, s.opt.AdmissionTimeout)
	d, err := s.store.Admit(actx, req)
	cancel()
	if err != nil {
		s.store.abandonLater(req) // it may have run: take it back at the next beat
		if ctx.Err() != nil {
			s.br.abort()
			s.ceiling.undoAt(now, cd.Ticket)
			return Decision{}, fmt.Errorf("admission: %w", ctx.Err())
		}
		s.m.storeErrors.Inc()
		s.br.failure(s.now())
		return s.degraded(req, p, cd.Ticket, now), nil
	}
	s.br.success()
	if !d.Allowed {
		s.m.storeRefused.Inc()
		s.ceiling.undoAt(now, cd.Ticket)
		s.deny.note(req, p, d, now)
		return d, nil
	}
	s.m.storeAllowed.Inc()
	d.Ticket = s.wrap(d.Ticket, cd.Ticket, d.Ticket)
	return d, nil
}

func (s *Shared) wrap(like, ceiling, inner *Ticket) *Ticket {
	return &Ticket{ID: like.ID, Tenant: like.Tenant, Model: like.Model,
		ChargedInput: like.ChargedInput, ChargedOutput: like.ChargedOutput,
		plan: like.plan, impl: &sharedTicket{ceiling: ceiling, inner: inner}}
}

// degraded decides req without the store, by the tenant's policy.
func (s *Shared) degraded(req Request, p plan, ceiling *Ticket, now time.Time) Decision {
	s.m.degradedFor(p.policy).Inc()
	switch p.policy {
	case PolicyOpen:
		return Decision{Allowed: true, Degraded: true, Ticket: s.wrap(ceiling, ceiling, nil)}
	case PolicyClosed:
		s.ceiling.undoAt(now, ceiling)
		return Decision{Reason: ReasonStore, Degraded: true, RetryAfter: s.opt.Cooldown}
	}
	s.fallback.SetShare(s.Share())
	d := s.fallback.admitAt(now, req, s.store.heldIn(req, p))
	d.Degraded = true
	if !d.Allowed {
		s.ceiling.undoAt(now, ceiling)
		return d
	}
	d.Ticket = s.wrap(d.Ticket, ceiling, d.Ticket)
	return d
}

// Settle settles a ticket where it was admitted: the local ceiling always,
// then Redis (bounded by SettleTimeout; a failure is retried by the
// heartbeat) or the local fallback.
func (s *Shared) Settle(ctx context.Context, t *Ticket, u Usage) error {
	if t == nil {
		return nil
	}
	st, ok := t.impl.(*sharedTicket)
	if !ok {
		return ErrForeignTicket
	}
	if !t.settled.CompareAndSwap(false, true) {
		return nil
	}
	now := s.now()
	_ = s.ceiling.SettleAt(now, st.ceiling, u)
	switch {
	case st.inner == nil:
		return nil
	case st.inner.impl == s.fallback:
		return s.fallback.SettleAt(now, st.inner, u)
	}
	if s.br.isOpen() {
		s.store.settleLater(st.inner, u)
		return nil
	}
	sctx, cancel := context.WithTimeout(ctx, s.opt.SettleTimeout)
	defer cancel()
	if err := s.store.Settle(sctx, st.inner, u); err != nil {
		return fmt.Errorf("%w: %w", ErrSettleDeferred, err)
	}
	return nil
}

// Snapshot reads the tenant's status from Redis; when Redis cannot answer
// it reports this node's own use (Degraded set).
func (s *Shared) Snapshot(ctx context.Context, tenant string, l Limits) (Status, error) {
	if !s.br.isOpen() {
		sctx, cancel := context.WithTimeout(ctx, s.opt.AdmissionTimeout)
		st, err := s.store.Snapshot(sctx, tenant, l)
		cancel()
		if err == nil {
			return st, nil
		}
	}
	st, err := s.ceiling.Snapshot(ctx, tenant, l)
	st.Degraded = true
	for i := range st.Models {
		st.Models[i].Degraded = true
	}
	return st, err
}

// Run runs the Redis heartbeat until ctx is done.
func (s *Shared) Run(ctx context.Context) error { return s.store.Run(ctx) }

// Close releases what NewFromConfig opened (the Redis client).
func (s *Shared) Close() error {
	if s.closer == nil {
		return nil
	}
	return s.closer()
}
