package limiter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrAbandoned is returned by Redis.Admit for an id whose admission was
// abandoned (its caller timed out and took a local decision).
var ErrAbandoned = errors.New("limiter: admission abandoned after a timeout")

// maxPending bounds the settles queued for the heartbeat.
const maxPending = 100000

// Client is what Redis needs of a go-redis client; *redis.Client,
// *redis.ClusterClient and *redis.Ring satisfy it.
type Client interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
}

// RedisOptions configure a Redis limiter.
type RedisOptions struct {
	// LeaseTTL is how long a concurrency lease lives without renewal: the
	// time within which a crashed node's slots come back. Zero means 30s.
	LeaseTTL time.Duration
	// Heartbeat is the renewal period of Run. Zero means LeaseTTL/3.
	Heartbeat time.Duration
	// NodeID names this edge node in the live-node set. Empty means a
	// random id.
	NodeID string
}

func (o RedisOptions) withDefaults() RedisOptions {
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = 30 * time.Second
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = o.LeaseTTL / 3
	}
	if o.NodeID == "" {
		o.NodeID = randomID()
	}
	return o
}

func randomID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Redis is the shared limiter: every decision is one Lua script on Redis
// (single node or Cluster) with Redis TIME as the clock, so any number of
// edge nodes enforce one set of limits exactly. Run must be running for
// leases to outlive LeaseTTL. Errors are returned as they are; Shared adds
// the timeout, circuit breaker and store-failure policies.
//
// Admission ids are remembered while the lease lives and for one LeaseTTL
// after the settle: a retried admission of a live request returns the
// original charge without charging again, and an id reused after its settle
// is a new admission. Redis is safe for simultaneous use by multiple
// goroutines.
type Redis struct {
	client Client
	opt    RedisOptions

	mu      sync.Mutex
	live    map[*Ticket]struct{} // tickets whose leases Run renews
	pending []pendingSettle      // settles to retry on the next beat

	nodes atomic.Int64 // live edge nodes seen at the last beat (0: unknown)
}

var _ Limiter = (*Redis)(nil)

// NewRedis returns a Redis limiter on client.
func NewRedis(client Client, opt RedisOptions) *Redis {
	return &Redis{client: client, opt: opt.withDefaults(), live: make(map[*Ticket]struct{})}
}

// Options returns the options in force (defaults applied).
func (r *Redis) Options() RedisOptions { return r.opt }

// Nodes is the number of live edge nodes seen at the last heartbeat, 0
// before the first.
func (r *Redis) Nodes() int { return int(r.nodes.Load()) }

// recordTTL is how long an unsettled admission record lives between beats.
func (r *Redis) recordTTL() time.Duration { return 2 * r.opt.LeaseTTL }

// Admit runs the admission script. A refused admission writes nothing. A
// request without an ID gets a random one (and no retry protection).
func (r *Redis) Admit(ctx context.Context, req Request) (Decision, error) {
	if req.ID == "" {
		req.ID = randomID()
	}
	p := newPlan(req, 1)
	pre := scopePrefix(req.Tenant, req.Model, p.scoped)
	keys := []string{pre + ":c", pre + ":r", pre + ":k", pre + ":i", pre + ":o",
		recordKey(req.Tenant, req.ID)}
	vals, err := admitScript.Run(ctx, r.client, keys,
		req.ID, r.opt.LeaseTTL.Microseconds(), r.recordTTL().Milliseconds(), p.maxConc,
		p.req.rate, p.req.burst, p.tok.rate, p.tok.burst,
		p.in.rate, p.in.burst, p.out.rate, p.out.burst,
		p.costIn, p.costOut, boolArg(p.enforce)).Int64Slice()
	if err != nil {
		return Decision{}, fmt.Errorf("admission script: %w", err)
	}
	if len(vals) != 11 {
		return Decision{}, fmt.Errorf("admission script: %d values, want 11", len(vals))
	}
	if vals[0] == 4 {
		return Decision{}, ErrAbandoned
	}
	return r.decision(req, p, vals), nil
}

func boolArg(b bool) int {
	if b {
		return 1
	}
	return 0
}

var reasons = [...]string{"", ReasonConcurrency, ReasonRequests, ReasonTokens,
	ReasonInputTokens, ReasonOutputTokens}

func (r *Redis) decision(req Request, p plan, v []int64) Decision {
	status, reason, wait, inflight, now := v[0], v[1], v[2], v[3], v[4]
	var d Decision
	if reason > 0 && reason < int64(len(reasons)) {
		d.Reason = reasons[reason]
	}
	switch status {
	case 0:
		d.RetryAfter = time.Duration(wait) * time.Microsecond
	case 3:
		d.Allowed, d.WouldRefuse = true, true
	default:
		d.Allowed = true
	}
	d.Concurrency = concurrencyQuota(p.maxConc, inflight)
	d.Requests = remoteQuota(p.req, v[5], now)
	d.Tokens = remoteQuota(p.tok, v[6], now)
	d.InputTokens = remoteQuota(p.in, v[7], now)
	d.OutputTokens = remoteQuota(p.out, v[8], now)
	if d.Allowed {
		p.costIn, p.costOut = v[9], v[10] // a retried id keeps its first charge
		d.Ticket = &Ticket{ID: req.ID, Tenant: req.Tenant, Model: req.Model,
			ChargedInput: p.costIn, ChargedOutput: p.costOut, plan: p, impl: r}
		r.mu.Lock()
		r.live[d.Ticket] = struct{}{}
		r.mu.Unlock()
	}
	return d
}

// remoteQuota reports a bucket from a TAT and now in Redis microseconds.
func remoteQuota(b bucket, tat, now int64) Quota {
	if !b.on() {
		return Quota{}
	}
	return b.quota(float64(tat-now)*1e3, 0)
}

// Settle releases the lease and applies actual − charged, once. When Redis
// cannot be reached the settle is retried by Run for up to LeaseTTL (the
// lease itself expires anyway, since it is no longer renewed).
func (r *Redis) Settle(ctx context.Context, t *Ticket, u Usage) error {
	if t == nil {
		return nil
	}
	if t.impl != r {
		return ErrForeignTicket
	}
	if !t.settled.CompareAndSwap(false, true) {
		return nil
	}
	r.mu.Lock()
	delete(r.live, t)
	r.mu.Unlock()
	ps := pendingSettle{t: t, u: u, since: time.Now()}
	sc := r.settleCall(ps)
	if err := sc.script.Run(ctx, r.client, sc.keys, sc.args...).Err(); err != nil {
		r.queue(ps)
		return fmt.Errorf("settle script: %w", err)
	}
	return nil
}

// settleLater releases t's lease from the heartbeat set and queues its
// settle for the next beat, without calling Redis now.
func (r *Redis) settleLater(t *Ticket, u Usage) {
	if t == nil || t.impl != r || !t.settled.CompareAndSwap(false, true) {
		return
	}
	r.mu.Lock()
	delete(r.live, t)
	r.mu.Unlock()
	r.queue(pendingSettle{t: t, u: u, since: time.Now()})
}

type pendingSettle struct {
	t       *Ticket
	u       Usage
	since   time.Time
	abandon bool // undo an admission whose answer was lost
}

// settleCall is the settle script call for ps.
func (r *Redis) settleCall(ps pendingSettle) *scriptCall {
	t, p := ps.t, ps.t.plan
	in, out := clampUsage(ps.u)
	pre := scopePrefix(t.Tenant, t.Model, p.scoped)
	mode := "settle"
	if ps.abandon {
		mode = "abandon"
	}
	return &scriptCall{script: settleScript,
		keys: []string{pre + ":c", pre + ":k", pre + ":i", pre + ":o", recordKey(t.Tenant, t.ID), pre + ":r"},
		args: []any{t.ID, r.opt.LeaseTTL.Milliseconds(), p.tok.rate, p.in.rate, p.out.rate,
			in + out - p.total(), in - p.costIn, out - p.costOut, mode, p.req.rate,
			p.tok.burst, p.in.burst, p.out.burst}}
}

// abandonLater queues, for the next heartbeat, the undoing of an admission
// whose outcome was not seen (timeout, lost connection): if it ran, its
// lease, request and charge are taken back; if it has not, it never will.
func (r *Redis) abandonLater(req Request) {
	if req.ID == "" {
		return
	}
	t := &Ticket{ID: req.ID, Tenant: req.Tenant, Model: req.Model, plan: newPlan(req, 1)}
	r.queue(pendingSettle{t: t, since: time.Now(), abandon: true})
}

func (r *Redis) queue(ps pendingSettle) {
	r.mu.Lock()
	if len(r.pending) < maxPending {
		r.pending = append(r.pending, ps)
	}
	r.mu.Unlock()
}

// Snapshot reads tenant's limits and use from Redis (writes nothing).
func (r *Redis) Snapshot(ctx context.Context, tenant string, lim Limits) (Status, error) {
	names := append([]string{""}, modelNames(lim)...)
	pipe := r.client.Pipeline()
	cmds := make([]*redis.Cmd, len(names))
	plans := make([]plan, len(names))
	for i, m := range names {
		plans[i] = newPlan(Request{Tenant: tenant, Model: m, Limits: lim}, 1)
		pre := scopePrefix(tenant, m, plans[i].scoped)
		cmds[i] = statusScript.Eval(ctx, pipe, []string{pre + ":c", pre + ":r", pre + ":k", pre + ":i", pre + ":o"})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return Status{}, fmt.Errorf("status script: %w", err)
	}
	var out Status
	for i, m := range names {
		v, err := cmds[i].Int64Slice()
		if err != nil || len(v) != 6 {
			return Status{}, fmt.Errorf("status script: %v values: %w", len(v), err)
		}
		p, now := plans[i], v[0]
		st := Status{Tenant: tenant, Model: m, Enforced: p.enforce, InFlight: v[1],
			Concurrency: concurrencyQuota(p.maxConc, v[1]),
			Requests:    remoteQuota(p.req, v[2], now), Tokens: remoteQuota(p.tok, v[3], now),
			InputTokens: remoteQuota(p.in, v[4], now), OutputTokens: remoteQuota(p.out, v[5], now)}
		if i == 0 {
			out = st
		} else {
			out.Models = append(out.Models, st)
		}
	}
	return out, nil
}

// errNoScript reports whether err is Redis' NOSCRIPT.
func errNoScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}
