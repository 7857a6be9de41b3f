package limiter

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// ErrForeignTicket is returned by Settle for a ticket that another limiter
// issued.
var ErrForeignTicket = errors.New("limiter: ticket issued by another limiter")

// Local is the in-process limiter: GCRA token buckets (the rate + burst
// model of golang.org/x/time/rate, plus debt and capped refunds, with the
// same arithmetic as the Redis scripts) and an in-flight
// counter per tenant, and per model with an override. It serves a single
// node on its own (the embedded default) and is the degraded-mode fallback
// of Shared, enforcing this node's Share of every limit.
//
// Admission IDs are not remembered: Local never sees a retried admission.
// State for a tenant is kept for the life of the Local (tenants come from
// configuration, so the set is bounded). Local is safe for simultaneous use
// by multiple goroutines.
type Local struct {
	share atomic.Uint64 // float64 bits
	base  time.Time     // monotonic origin of the TATs

	tenants sync.Map // tenant name -> *localTenant
}

type localTenant struct {
	mu     sync.Mutex
	all    localScope             // requests without a model override
	models map[string]*localScope // per-model overrides, created on use
}

// localScope is one lease set and its buckets; TATs in ns since Local.base.
type localScope struct {
	inflight          int64
	req, tok, in, out float64
}

var _ Limiter = (*Local)(nil)

// NewLocal returns a Local enforcing share (0 < share ≤ 1) of every limit;
// a share outside that range means 1.
func NewLocal(share float64) *Local {
	l := &Local{base: time.Now()}
	l.SetShare(share)
	return l
}

// SetShare changes the fraction of every limit this Local enforces, from the
// next decision on. A share outside (0, 1] means 1.
func (l *Local) SetShare(share float64) {
	if !(share > 0 && share <= 1) {
		share = 1
	}
	l.share.Store(math.Float64bits(share))
}

// Share is the fraction of every limit this Local enforces.
func (l *Local) Share() float64 { return math.Float64frombits(l.share.Load()) }

// Admit decides at the current time; it never returns an error.
func (l *Local) Admit(_ context.Context, req Request) (Decision, error) {
	return l.AdmitAt(time.Now(), req), nil
}

// Settle settles at the current time.
func (l *Local) Settle(_ context.Context, t *Ticket, u Usage) error {
	return l.SettleAt(time.Now(), t, u)
}

// Run does nothing until ctx is done: Local has no background work. It lets
// Local and Shared be run alike.
func (l *Local) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// Close does nothing.
func (l *Local) Close() error { return nil }

func (l *Local) ns(t time.Time) float64 { return float64(t.Sub(l.base)) }

func (l *Local) tenant(name string) *localTenant {
	if t, ok := l.tenants.Load(name); ok {
		return t.(*localTenant)
	}
	t, _ := l.tenants.LoadOrStore(name, &localTenant{})
	return t.(*localTenant)
}

// scope returns the lease set and buckets for p; t.mu must be held.
func (t *localTenant) scope(model string, scoped bool) *localScope {
	if !scoped {
		return &t.all
	}
	s := t.models[model]
	if s == nil {
		if t.models == nil {
			t.models = make(map[string]*localScope)
		}
		s = &localScope{}
		t.models[model] = s
	}
	return s
}

// AdmitAt decides at now. Only an admitted decision allocates (its Ticket).
func (l *Local) AdmitAt(now time.Time, req Request) Decision {
	return l.admitAt(now, req, 0)
}

// admitAt decides at now, counting held more streams in flight than its
// own (Shared's fallback: this node's leases held in Redis).
func (l *Local) admitAt(now time.Time, req Request, held int64) Decision {
	p := newPlan(req, l.Share())
	t := l.tenant(req.Tenant)
	n := l.ns(now)
	t.mu.Lock()
	s := t.scope(req.Model, p.scoped)
	var c check
	if p.maxConc > 0 && s.inflight+held >= p.maxConc {
		c.refuse(ReasonConcurrency, concurrencyRetry)
	}
	req2, ok2, w := takeIf(p.req, s.req, n, 1)
	if !ok2 {
		c.refuse(ReasonRequests, w)
	}
	tok, okT, w := takeIf(p.tok, s.tok, n, p.total())
	if !okT {
		c.refuse(ReasonTokens, w)
	}
	in, okI, w := takeIf(p.in, s.in, n, p.costIn)
	if !okI {
		c.refuse(ReasonInputTokens, w)
	}
	out, okO, w := takeIf(p.out, s.out, n, p.costOut)
	if !okO {
		c.refuse(ReasonOutputTokens, w)
	}
	d := c.decision(p)
	if d.Allowed {
		if c.refused() { // shadow mode: charge as if admitted
			req2, tok = forceIf(p.req, s.req, n, 1), forceIf(p.tok, s.tok, n, p.total())
			in, out = forceIf(p.in, s.in, n, p.costIn), forceIf(p.out, s.out, n, p.costOut)
		}
		s.inflight++
		s.req, s.tok, s.in, s.out = req2, tok, in, out
	}
	l.quotas(&d, p, s, n)
	t.mu.Unlock()
	if d.Allowed {
		d.Ticket = &Ticket{ID: req.ID, Tenant: req.Tenant, Model: req.Model,
			ChargedInput: p.costIn, ChargedOutput: p.costOut, plan: p, impl: l}
	}
	return d
}

func takeIf(b bucket, tat, now float64, n int64) (float64, bool, float64) {
	if !b.on() {
		return tat, true, 0
	}
	return b.take(tat, now, n)
}

func forceIf(b bucket, tat, now float64, n int64) float64 {
	if !b.on() {
		return tat
	}
	return b.force(tat, now, n)
}

func adjustIf(b bucket, tat, now float64, d int64) float64 {
	if !b.on() || d == 0 {
		return tat
	}
	return b.adjust(tat, now, d)
}

func quotaIf(b bucket, tat, now float64) Quota {
	if !b.on() {
		return Quota{}
	}
	return b.quota(tat, now)
}

func (l *Local) quotas(d *Decision, p plan, s *localScope, n float64) {
	d.Concurrency = concurrencyQuota(p.maxConc, s.inflight)
	d.Requests = quotaIf(p.req, s.req, n)
	d.Tokens = quotaIf(p.tok, s.tok, n)
	d.InputTokens = quotaIf(p.in, s.in, n)
	d.OutputTokens = quotaIf(p.out, s.out, n)
}

// SettleAt settles t at now: it applies actual − charged to each token
// bucket (debt allowed, refunds never beyond a full bucket) and releases
// the in-flight slot. Only the first call for a ticket has an effect.
func (l *Local) SettleAt(now time.Time, t *Ticket, u Usage) error {
	return l.settleAt(now, t, u, false)
}

// undoAt takes back an admission entirely (its request, its token charge
// and its slot), for a request the shared store then refused.
func (l *Local) undoAt(now time.Time, t *Ticket) {
	_ = l.settleAt(now, t, Usage{}, true)
}

func (l *Local) settleAt(now time.Time, t *Ticket, u Usage, undo bool) error {
	if t == nil {
		return nil
	}
	if t.impl != l {
		return ErrForeignTicket
	}
	if !t.settled.CompareAndSwap(false, true) {
		return nil
	}
	p := t.plan
	lt := l.tenant(t.Tenant)
	n := l.ns(now)
	lt.mu.Lock()
	defer lt.mu.Unlock()
	s := lt.scope(t.Model, p.scoped)
	s.inflight = max(s.inflight-1, 0)
	in, out := clampUsage(u)
	s.tok = adjustIf(p.tok, s.tok, n, in+out-p.total())
	s.in = adjustIf(p.in, s.in, n, in-p.costIn)
	s.out = adjustIf(p.out, s.out, n, out-p.costOut)
	if undo {
		s.req = adjustIf(p.req, s.req, n, -1)
	}
	return nil
}
