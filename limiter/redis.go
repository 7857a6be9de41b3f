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

// ErrExpired is returned by Redis.Admit when Redis ran the admission after
// its deadline (the caller had given up): nothing was written.
var ErrExpired = errors.New("limiter: admission reached Redis after its deadline")

// ErrSettleDeferred wraps a settle that Redis did not take in time: the
// ticket counts as settled here and its write is queued for the
// heartbeat's next beat, so the tenant's charge is late, not lost.
var ErrSettleDeferred = errors.New("limiter: settle deferred (retried by the heartbeat)")

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
	// EpochPoll is how often Run checks, for every scope where this node
	// holds leases, that Redis still has the scope's epoch (a Redis
	// restarted empty has none): on a change the node re-asserts its
	// leases at once. A scope whose epoch goes missing while Redis is
	// younger than the restart window (see restartWindow) admits nothing
	// for 3×EpochPoll, the time every node has to re-assert; a scope
	// without an epoch on an older Redis (a new tenant, or one unused for
	// the epoch key's TTL) is new and admits at once. Zero means 100ms.
	EpochPoll time.Duration
}

// epochKeyTTL is the life of a scope's epoch key, renewed by every
// heartbeat that renews leases in the scope. A scope unused for longer
// loses it, and is then new again (no wait, see restartWindow).
const epochKeyTTL = 7 * 24 * time.Hour

// epochGrace is how long a new epoch admits nothing.
func (o RedisOptions) epochGrace() time.Duration { return 3 * o.EpochPoll }

// restartWindow is how young a Redis process (INFO server
// uptime_in_seconds, read by admit.lua only when a scope has no epoch) must
// be for a missing epoch to mean lost data: within it the nodes holding
// leases may not have re-asserted them yet, so the scope waits the grace;
// past it every live node has polled (every EpochPoll) and re-asserted,
// which rewrites the epochs of its scopes, so a scope still without one
// holds no lease and is simply new. Whole seconds, as INFO reports them:
// 10 polls, at least 2s.
func (o RedisOptions) restartWindow() int64 {
	return int64(max(10*o.EpochPoll, 2*time.Second)+time.Second-1) / int64(time.Second)
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
	if o.EpochPoll <= 0 {
		o.EpochPoll = 100 * time.Millisecond
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
	held    map[string]int64     // live tickets per scope prefix
	epochs  map[string]int64     // last epoch seen per scope prefix
	pending []pendingSettle      // settles to retry on the next beat

	clock   atomic.Pointer[clockSample] // Redis TIME − local time
	clockMu sync.Mutex                  // one clock sync at a time

	nodes atomic.Int64 // live edge nodes seen at the last beat (0: unknown)

	recent recentRing   // settles sent in the last LeaseTTL (resettle.go)
	watch  *serverWatch // master changes; nil: not watched
}

var _ Limiter = (*Redis)(nil)

// NewRedis returns a Redis limiter on client.
func NewRedis(client Client, opt RedisOptions) *Redis {
	return &Redis{client: client, opt: opt.withDefaults(), live: make(map[*Ticket]struct{}),
		held: make(map[string]int64), epochs: make(map[string]int64)}
}

// clockSample is one measure of Redis' clock against ours: Redis TIME was
// offset ± err after local time, measured at at.
type clockSample struct {
	offset, err time.Duration
	at          time.Time
}

// observeClock records a reply's Redis TIME (µs) read between local times
// t0 and t1. A sample replaces the kept one when it is at least as precise
// or the kept one is older than a minute.
func (r *Redis) observeClock(t0, t1 time.Time, redisMicros int64) {
	if redisMicros <= 0 {
		return
	}
	mid := t0.Add(t1.Sub(t0) / 2)
	s := &clockSample{offset: time.UnixMicro(redisMicros).Sub(mid), err: t1.Sub(t0)/2 + time.Microsecond, at: t1}
	for {
		old := r.clock.Load()
		if old != nil && s.err > old.err && t1.Sub(old.at) < time.Minute {
			return
		}
		if r.clock.CompareAndSwap(old, s) {
			return
		}
	}
}

// syncClock reads Redis TIME once if no clock sample is known yet.
func (r *Redis) syncClock(ctx context.Context) {
	r.clockMu.Lock()
	defer r.clockMu.Unlock()
	if r.clock.Load() != nil {
		return
	}
	pipe := r.client.Pipeline()
	t0 := time.Now()
	cmd := pipe.Time(ctx)
	if _, err := pipe.Exec(ctx); err != nil {
		return
	}
	t1 := time.Now()
	if v, err := cmd.Result(); err == nil {
		r.observeClock(t0, t1, v.UnixMicro())
	}
}

// redisDeadline converts a local deadline to Redis TIME µs, early by the
// clock sample's error and 1ms, so that the script never runs an admission
// its caller has given up on. Zero (no deadline) when none is known.
func (r *Redis) redisDeadline(ctx context.Context) int64 {
	dl, ok := ctx.Deadline()
	if !ok {
		return 0
	}
	if r.clock.Load() == nil {
		r.syncClock(ctx)
	}
	s := r.clock.Load()
	if s == nil {
		return 0
	}
	return dl.Add(s.offset - s.err - time.Millisecond).UnixMicro()
}

// heldIn is the number of this node's live leases in Redis in the scope of
// req (what the degraded fallback adds to its own count).
func (r *Redis) heldIn(req Request, p plan) int64 {
	pre := scopePrefix(req.Tenant, req.Model, p.scoped)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.held[pre]
}

// track adds t to the live set (renewed by Run, counted by heldIn).
func (r *Redis) track(t *Ticket) {
	pre := scopePrefix(t.Tenant, t.Model, t.plan.scoped)
	r.mu.Lock()
	r.live[t] = struct{}{}
	r.held[pre]++
	r.mu.Unlock()
}

// untrack removes t from the live set.
func (r *Redis) untrack(t *Ticket) {
	pre := scopePrefix(t.Tenant, t.Model, t.plan.scoped)
	r.mu.Lock()
	if _, ok := r.live[t]; ok {
		delete(r.live, t)
		if r.held[pre]--; r.held[pre] <= 0 {
			delete(r.held, pre)
		}
	}
	r.mu.Unlock()
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
		recordKey(req.Tenant, req.ID), pre + ":e"}
	dl := r.redisDeadline(ctx)
	for try := 0; ; try++ {
		t0 := time.Now()
		vals, err := admitScript.Run(ctx, r.client, keys,
			req.ID, r.opt.LeaseTTL.Microseconds(), r.recordTTL().Milliseconds(), p.maxConc,
			p.req.rate, p.req.burst, p.tok.rate, p.tok.burst,
			p.in.rate, p.in.burst, p.out.rate, p.out.burst,
			p.costIn, p.costOut, boolArg(p.enforce), dl,
			r.opt.epochGrace().Microseconds(), epochKeyTTL.Milliseconds(), r.opt.restartWindow()).Int64Slice()
		if err != nil {
			return Decision{}, fmt.Errorf("admission script: %w", err)
		}
		if len(vals) != 12 {
			return Decision{}, fmt.Errorf("admission script: %d values, want 12", len(vals))
		}
		r.observeClock(t0, time.Now(), vals[4])
		switch vals[0] {
		case 4:
			return Decision{}, ErrAbandoned
		case 5:
			return Decision{}, ErrExpired
		case 6:
			// A new epoch: re-assert this node's leases (all scopes: a
			// restart lost them all), then wait for the other nodes to do
			// the same.
			if try >= 3 {
				return Decision{}, errors.New("admission script: scope epoch still not ready")
			}
			if err := r.reassert(ctx); err != nil {
				return Decision{}, err
			}
			if err := sleepCtx(ctx, time.Duration(vals[2])*time.Microsecond+time.Millisecond); err != nil {
				return Decision{}, fmt.Errorf("admission: waiting for a new epoch: %w", err)
			}
			continue
		}
		r.noteEpoch(pre, vals[11])
		return r.decision(req, p, vals), nil
	}
}

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-tm.C:
		return nil
	}
}

// noteEpoch remembers the epoch seen in scope pre.
func (r *Redis) noteEpoch(pre string, epoch int64) {
	if epoch == 0 {
		return
	}
	r.mu.Lock()
	r.epochs[pre] = epoch
	r.mu.Unlock()
}

// reassert renews (re-adds) every live lease of this node now, in one
// pipeline, and notes each scope's epoch.
func (r *Redis) reassert(ctx context.Context) error {
	calls := r.renewCalls()
	if len(calls) == 0 {
		return nil
	}
	if err := runPipeline(ctx, r.client, calls); err != nil {
		return fmt.Errorf("re-asserting leases: %w", err)
	}
	r.noteRenewEpochs(calls)
	return nil
}

// noteRenewEpochs notes the epochs the renewal calls returned.
func (r *Redis) noteRenewEpochs(calls []*scriptCall) {
	for _, c := range calls {
		if c.scope == "" || c.cmd == nil {
			continue
		}
		if v, err := c.cmd.Int64Slice(); err == nil && len(v) == 2 {
			r.noteEpoch(c.scope, v[1])
		}
	}
}

// pollEpochs reads the epoch of every scope where this node holds leases
// and re-asserts the leases when one changed (Redis restarted empty, or the
// key expired).
func (r *Redis) pollEpochs(ctx context.Context) error {
	r.mu.Lock()
	scopes := make([]string, 0, len(r.held))
	known := make([]int64, 0, len(r.held))
	for pre := range r.held {
		scopes = append(scopes, pre)
		known = append(known, r.epochs[pre])
	}
	r.mu.Unlock()
	if len(scopes) == 0 {
		return nil
	}
	pipe := r.client.Pipeline()
	cmds := make([]*redis.StringCmd, len(scopes))
	for i, pre := range scopes {
		cmds[i] = pipe.Get(ctx, pre+":e")
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return fmt.Errorf("epoch poll: %w", err)
	}
	for i, c := range cmds {
		v, err := c.Int64()
		if err != nil && err != redis.Nil {
			return fmt.Errorf("epoch poll: %w", err)
		}
		if v != known[i] {
			return r.reassert(ctx)
		}
	}
	return nil
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
		r.track(d.Ticket)
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
	r.untrack(t)
	ps := pendingSettle{t: t, u: u, since: time.Now()}
	sc := r.settleCall(ps)
	if err := sc.script.Run(ctx, r.client, sc.keys, sc.args...).Err(); err != nil {
		r.queue(ps)
		return fmt.Errorf("settle script: %w", err)
	}
	r.recordSent(ps)
	return nil
}

// settleLater releases t's lease from the heartbeat set and queues its
// settle for the next beat, without calling Redis now.
func (r *Redis) settleLater(t *Ticket, u Usage) {
	if t == nil || t.impl != r || !t.settled.CompareAndSwap(false, true) {
		return
	}
	r.untrack(t)
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
