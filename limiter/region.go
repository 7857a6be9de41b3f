package limiter

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Regions: a tenant's global limits shared by edge regions far apart.
//
// Each region's nodes admit against their regional Redis exactly as a
// single-region fleet does (one local round trip); what changes is the
// limit value they enforce: the region's share of each global limit. A
// rebalancer goroutine per node (owned by Region, ended with Run's
// context) reports the node's demand to the global store every Interval,
// off the request path, and receives the region's new share. The share
// algorithm runs in one Lua script on the global store (region_sync.lua),
// which keeps the sum of all regions' reserves at most the global limit:
// a share moves only after its giver has reported enforcing the smaller
// value (lend, then borrow). docs/SCALING.md "Regions" states the bounds.

//go:embed lua/region_sync.lua
var regionSyncLua string

var regionSyncScript = redis.NewScript(regionSyncLua)

// RegionOptions configure a Region. Zero fields take the defaults noted.
type RegionOptions struct {
	// Name is this node's region; it must be one of Regions.
	Name string
	// Regions are all the regions sharing the global limits (every one is
	// guaranteed its floor, also before it ever reports).
	Regions []string
	// NodeID names this node in the global store. Empty means a random id.
	NodeID string
	// Interval is the rebalancing period. Zero means 1s.
	Interval time.Duration
	// Hold is how long a region cut off from the global store keeps its
	// last share unchanged. Zero means 3×Interval.
	Hold time.Duration
	// Decay is how long, after Hold, a cut-off region takes to decay its
	// share linearly to its floor. Zero means 20×Interval.
	Decay time.Duration
	// MinShare is the fraction of an even split each region is always
	// guaranteed (its floor is MinShare/len(Regions) of each limit). Zero
	// means 0.2.
	MinShare float64
	// SyncTimeout bounds one rebalancing round with the global store. It
	// must cover a new connection's handshake too (several round trips
	// across an ocean): a shorter one closes every connection before it is
	// ready. Zero means 2×Interval, at least 2s.
	SyncTimeout time.Duration
	// Logger logs the global store's failures and recoveries. Nil means
	// slog.Default().
	Logger *slog.Logger
}

func (o RegionOptions) withDefaults() RegionOptions {
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.Hold <= 0 {
		o.Hold = 3 * o.Interval
	}
	if o.Decay <= 0 {
		o.Decay = 20 * o.Interval
	}
	if o.MinShare <= 0 {
		o.MinShare = 0.2
	}
	if o.SyncTimeout <= 0 {
		o.SyncTimeout = max(2*o.Interval, 2*time.Second)
	}
	if o.NodeID == "" {
		o.NodeID = randomID()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// validate reports what makes o unusable (after withDefaults).
func (o RegionOptions) validate() error {
	var errs []error
	if o.Name == "" {
		errs = append(errs, errors.New("region name is required"))
	}
	seen := false
	for _, r := range o.Regions {
		if r == o.Name {
			seen = true
		}
	}
	if !seen {
		errs = append(errs, fmt.Errorf("region %q is not in regions %v", o.Name, o.Regions))
	}
	if o.MinShare > 1 {
		errs = append(errs, fmt.Errorf("min_share %v is more than 1", o.MinShare))
	}
	return errors.Join(errs...)
}

// floor is every region's guaranteed share.
func (o RegionOptions) floor() float64 { return o.MinShare / float64(max(len(o.Regions), 1)) }

// Region is the limiter of an edge node in one region of several: an inner
// Service (the regional Redis, normally a Shared) admits every request
// with the tenant's limits scaled by the region's current share. Tenants
// without limits pass through untouched. Region is safe for simultaneous
// use by multiple goroutines.
type Region struct {
	inner  Service
	global Client
	opt    RegionOptions
	floor  float64
	now    func() time.Time
	closer func() error

	tenants sync.Map // tenant id -> *regionTenant

	syncs, failures atomic.Int64 // rebalancing rounds that succeeded / failed
	raisedMu        sync.Mutex
	raised          float64     // sum of every share increase granted (the overshoot bound's moves)
	down            atomic.Bool // the last round failed (for the log)
}

var _ Service = (*Region)(nil)

// regionTenant is one tenant's share and demand on this node.
type regionTenant struct {
	state atomic.Pointer[shareState]

	// Use since the last rebalancing round (the rebalancer swaps them to 0).
	tokens, requests atomic.Int64
	inflight, peak   atomic.Int64
	// The global limits last seen, to turn use into a fraction of them.
	gTok, gReq, gConc atomic.Int64

	demand   float64   // smoothed demand (rebalancer only)
	lastUsed time.Time // last round with any use (rebalancer only)
}

// shareState is a tenant's share as granted by one rebalancing round.
type shareState struct {
	base  float64   // the granted share
	since time.Time // local time the round was sent: hold and decay count from it
	// What the global store reported with the grant.
	globalDemand, reserved float64
	synced                 bool // granted by the global store (not the initial floor)
}

// NewRegion returns a Region admitting through inner and rebalancing with
// the global store on global. Run must run for shares to follow demand;
// until a tenant's first round it enforces the region's floor.
func NewRegion(inner Service, global Client, opt RegionOptions) (*Region, error) {
	opt = opt.withDefaults()
	if err := opt.validate(); err != nil {
		return nil, err
	}
	return &Region{inner: inner, global: global, opt: opt, floor: opt.floor(), now: time.Now}, nil
}

// Options returns the options in force (defaults applied).
func (r *Region) Options() RegionOptions { return r.opt }

// Inner returns the regional limiter.
func (r *Region) Inner() Service { return r.inner }

// limited reports whether l has any limit a share applies to.
func limited(l Limits) bool {
	return l.TokensPerMinute > 0 || l.RequestsPerMinute > 0 || l.MaxConcurrency > 0 ||
		l.InputTokensPerMinute > 0 || l.OutputTokensPerMinute > 0 || len(l.Models) > 0
}

func (r *Region) tenant(id string) *regionTenant {
	if v, ok := r.tenants.Load(id); ok {
		return v.(*regionTenant)
	}
	rt := &regionTenant{lastUsed: r.now()}
	rt.state.Store(&shareState{base: r.floor, since: r.now()})
	v, _ := r.tenants.LoadOrStore(id, rt)
	return v.(*regionTenant)
}

// decayed is a share granted `age` ago: held for Hold, then decaying
// linearly to the floor over Decay (the global store assumes the same, from
// a later instant).
func decayed(base, floor float64, age, hold, decay time.Duration) float64 {
	if age <= hold || base <= floor {
		return base
	}
	f := float64(age-hold) / float64(decay)
	if f >= 1 {
		return floor
	}
	return base - (base-floor)*f
}

// shareAt is the share the tenant enforces at now.
func (r *Region) shareAt(rt *regionTenant, now time.Time) float64 {
	s := rt.state.Load()
	return decayed(s.base, r.floor, now.Sub(s.since), r.opt.Hold, r.opt.Decay)
}

// scaleLimits returns l with every limit scaled by share (rounded down, at
// least 1), so the sum over regions never exceeds the global limit by
// rounding (except where a limit is below the number of regions).
func scaleLimits(l Limits, share float64) Limits {
	sc := func(v int64) int64 {
		if v <= 0 {
			return v
		}
		return max(1, int64(math.Floor(float64(v)*share)))
	}
	l.TokensPerMinute = sc(l.TokensPerMinute)
	l.InputTokensPerMinute = sc(l.InputTokensPerMinute)
	l.OutputTokensPerMinute = sc(l.OutputTokensPerMinute)
	l.RequestsPerMinute = sc(l.RequestsPerMinute)
	l.Burst = sc(l.Burst)
	l.MaxConcurrency = int(sc(int64(l.MaxConcurrency)))
	if len(l.Models) > 0 {
		m := make(map[string]Limits, len(l.Models))
		for k, v := range l.Models {
			m[k] = scaleLimits(v, share)
		}
		l.Models = m
	}
	return l
}

// Admit admits req in the regional store with the tenant's limits scaled
// by the region's share, and counts the demand for the next round.
func (r *Region) Admit(ctx context.Context, req Request) (Decision, error) {
	if !limited(req.Limits) {
		return r.inner.Admit(ctx, req)
	}
	rt := r.tenant(req.Tenant)
	eff, _ := req.Limits.Effective(req.Model)
	storeIfChanged(&rt.gTok, eff.TokensPerMinute) // read-mostly: no shared write per admission
	storeIfChanged(&rt.gReq, eff.RequestsPerMinute)
	storeIfChanged(&rt.gConc, int64(eff.MaxConcurrency))
	global := req.Limits
	req.Limits = scaleLimits(global, r.shareAt(rt, r.now()))
	d, err := r.inner.Admit(ctx, req)
	if err != nil {
		return d, err
	}
	rt.requests.Add(1)
	if d.Ticket != nil {
		rt.tokens.Add(d.Ticket.ChargedInput + d.Ticket.ChargedOutput)
		n := rt.inflight.Add(1)
		for p := rt.peak.Load(); n > p && !rt.peak.CompareAndSwap(p, n); p = rt.peak.Load() {
		}
	} else {
		in, out := Reserve(eff, req) // demand not served counts too
		rt.tokens.Add(in + out)
	}
	return d, nil
}

func storeIfChanged(a *atomic.Int64, v int64) {
	if a.Load() != v {
		a.Store(v)
	}
}

// Settle settles t in the regional store and corrects the demand count by
// actual − charged.
func (r *Region) Settle(ctx context.Context, t *Ticket, u Usage) error {
	if t == nil {
		return nil
	}
	first := !t.settled.Load()
	err := r.inner.Settle(ctx, t, u)
	if first {
		if v, ok := r.tenants.Load(t.Tenant); ok {
			rt := v.(*regionTenant)
			in, out := clampUsage(u)
			rt.tokens.Add(in + out - t.ChargedInput - t.ChargedOutput)
			rt.inflight.Add(-1)
		}
	}
	return err
}

// RegionStatus is a tenant's regional share and the fleet's global use, in
// /v1/usage (Status.Region) and on the status page.
type RegionStatus struct {
	// Name is this node's region.
	Name string `json:"name"`
	// Share is the fraction of every global limit this region enforces
	// now (the Quota limits of the Status are the region's).
	Share float64 `json:"share"`
	// Floor is the share this region is always guaranteed.
	Floor float64 `json:"floor"`
	// GlobalUse is the demand of all regions as a fraction of the global
	// limits, per minute (the largest over tokens, requests and
	// concurrency), as of LastSync.
	GlobalUse float64 `json:"global_use"`
	// Reserved is the sum of all regions' reserved shares (at most 1).
	Reserved float64 `json:"reserved"`
	// GlobalTokensPerMinute, GlobalRequestsPerMinute and
	// GlobalConcurrency are the tenant's global limits.
	GlobalTokensPerMinute   int64 `json:"global_tokens_per_minute,omitempty"`
	GlobalRequestsPerMinute int64 `json:"global_requests_per_minute,omitempty"`
	GlobalConcurrency       int   `json:"global_concurrency,omitempty"`
	// LastSync is when the share was last granted (zero before the first
	// round); Stale is set when that is longer ago than Hold (the share
	// is decaying toward the floor).
	LastSync time.Time `json:"last_sync,omitzero"`
	Stale    bool      `json:"stale,omitempty"`
}

// RegionStatus reports tenant's share on this node.
func (r *Region) RegionStatus(tenant string, l Limits) RegionStatus {
	now := r.now()
	rs := RegionStatus{Name: r.opt.Name, Share: r.floor, Floor: r.floor,
		GlobalTokensPerMinute: l.TokensPerMinute, GlobalRequestsPerMinute: l.RequestsPerMinute,
		GlobalConcurrency: l.MaxConcurrency}
	v, ok := r.tenants.Load(tenant)
	if !ok {
		return rs
	}
	rt := v.(*regionTenant)
	s := rt.state.Load()
	rs.Share = r.shareAt(rt, now)
	rs.GlobalUse, rs.Reserved = s.globalDemand, s.reserved
	if s.synced {
		rs.LastSync = s.since
		rs.Stale = now.Sub(s.since) > r.opt.Hold
	}
	return rs
}

// Snapshot reports the tenant's regional status (limits scaled by the
// share) with the regional share in Status.Region.
func (r *Region) Snapshot(ctx context.Context, tenant string, l Limits) (Status, error) {
	if !limited(l) {
		return r.inner.Snapshot(ctx, tenant, l)
	}
	share := 0.0
	if v, ok := r.tenants.Load(tenant); ok {
		share = r.shareAt(v.(*regionTenant), r.now())
	} else {
		share = r.floor
	}
	st, err := r.inner.Snapshot(ctx, tenant, scaleLimits(l, share))
	rs := r.RegionStatus(tenant, l)
	st.Region = &rs
	return st, err
}

// Run runs the inner limiter's background work and the rebalancer until
// ctx is done.
func (r *Region) Run(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- r.inner.Run(ctx) }()
	tick := time.NewTicker(r.opt.Interval)
	defer tick.Stop()
	r.Rebalance(ctx)
	for {
		select {
		case <-ctx.Done():
			return <-done
		case <-tick.C:
			r.Rebalance(ctx)
		}
	}
}

// Close closes the inner limiter and the global store's client.
func (r *Region) Close() error {
	err := r.inner.Close()
	if r.closer != nil {
		err = errors.Join(err, r.closer())
	}
	return err
}

// Syncs returns the rebalancing rounds that succeeded and failed.
func (r *Region) Syncs() (ok, failed int64) { return r.syncs.Load(), r.failures.Load() }

// Raised is the sum of every share increase this node was granted, over
// all tenants: each can refill a region's token bucket by that fraction of
// a burst (docs/SCALING.md "Regions", the overshoot bound).
func (r *Region) Raised() float64 {
	r.raisedMu.Lock()
	defer r.raisedMu.Unlock()
	return r.raised
}

// regionKey is a tenant's hash in the global store.
func regionKey(tenant string) string { return "sluice:rg:{t:" + keyEscaper.Replace(tenant) + "}" }

// demandOf turns a round's use into a fraction of the global limits per
// minute: the largest over tokens, requests and concurrency, at most 1.
func demandOf(rt *regionTenant, tokens, requests, peak int64, dt time.Duration) float64 {
	perMin := 60 / max(dt.Seconds(), 1e-3)
	d := 0.0
	if g := rt.gTok.Load(); g > 0 {
		d = max(d, float64(max(tokens, 0))*perMin/float64(g))
	}
	if g := rt.gReq.Load(); g > 0 {
		d = max(d, float64(requests)*perMin/float64(g))
	}
	if g := rt.gConc.Load(); g > 0 {
		d = max(d, float64(peak)/float64(g))
	}
	return min(d, 1)
}

// Rebalance runs one round now: every known tenant's demand is reported to
// the global store in one pipeline, bounded by SyncTimeout, and the grants
// replace the shares. A failed round changes nothing: each share keeps
// decaying from its last grant. Run calls it every Interval; tests call it
// to step a region.
func (r *Region) Rebalance(ctx context.Context) {
	now := r.now()
	type item struct {
		id string
		rt *regionTenant
	}
	var items []item
	var calls []*scriptCall
	forget := r.opt.Hold + r.opt.Decay + 3*r.opt.Interval
	args := []any{r.opt.Name, r.opt.NodeID, 0.0, 0.0, r.floor, r.opt.Hold.Microseconds(),
		r.opt.Decay.Microseconds(), (3 * r.opt.Interval).Microseconds(), (2 * forget).Milliseconds(), 0.0}
	for _, reg := range r.opt.Regions {
		args = append(args, reg)
	}
	r.tenants.Range(func(k, v any) bool {
		rt := v.(*regionTenant)
		tok, req := rt.tokens.Swap(0), rt.requests.Swap(0)
		peak := rt.peak.Swap(rt.inflight.Load())
		if tok > 0 || req > 0 || peak > 0 {
			rt.lastUsed = now
		} else if now.Sub(rt.lastUsed) > forget && r.shareAt(rt, now) <= r.floor {
			r.tenants.Delete(k) // a new entry starts at the floor, as the store assumes
			return true
		}
		dt := r.opt.Interval
		rt.demand = 0.5*rt.demand + 0.5*demandOf(rt, tok, req, peak, dt)
		a := append([]any(nil), args...)
		a[2] = strconv.FormatFloat(r.shareAt(rt, now), 'f', 9, 64)
		a[3] = strconv.FormatFloat(rt.demand, 'f', 9, 64)
		inf := 0.0
		if g := rt.gConc.Load(); g > 0 {
			inf = float64(max(rt.inflight.Load(), 0)) / float64(g)
		}
		a[9] = strconv.FormatFloat(inf, 'f', 9, 64)
		items = append(items, item{k.(string), rt})
		calls = append(calls, &scriptCall{script: regionSyncScript, keys: []string{regionKey(k.(string))}, args: a})
		return true
	})
	if len(calls) == 0 {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, r.opt.SyncTimeout)
	err := runPipeline(sctx, r.global, calls)
	cancel()
	failed := 0
	for i, c := range calls {
		if c.cmd == nil || c.cmd.Err() != nil {
			failed++
			continue
		}
		v, e := c.cmd.StringSlice()
		if e != nil || len(v) != 4 {
			failed++
			continue
		}
		grant, e1 := strconv.ParseFloat(v[0], 64)
		gd, _ := strconv.ParseFloat(v[1], 64)
		res, _ := strconv.ParseFloat(v[2], 64)
		if e1 != nil {
			failed++
			continue
		}
		if old := items[i].rt.state.Load().base; grant > old {
			r.raisedMu.Lock()
			r.raised += grant - old
			r.raisedMu.Unlock()
		}
		items[i].rt.state.Store(&shareState{base: grant, since: now, globalDemand: gd, reserved: res, synced: true})
	}
	if failed > 0 || err != nil {
		r.failures.Add(1)
		if !r.down.Swap(true) {
			r.opt.Logger.Warn("limiter: global store unreachable; regional shares held, then decaying to the floor",
				"region", r.opt.Name, "hold", r.opt.Hold, "decay", r.opt.Decay, "err", err)
		}
		return
	}
	r.syncs.Add(1)
	if r.down.Swap(false) {
		r.opt.Logger.Info("limiter: global store back; regional shares reconciled", "region", r.opt.Name)
	}
}

// RegionReport is the node's regional view for the admin status
// (GET /debug/regions): every tenant it has seen with its share.
type RegionReport struct {
	Region   string        `json:"region"`
	Regions  []string      `json:"regions"`
	Interval time.Duration `json:"interval_ns"`
	Floor    float64       `json:"floor"`
	// Syncs and SyncFailures count rebalancing rounds; Reachable is false
	// while the last round failed (shares held, then decaying).
	Syncs        int64 `json:"syncs"`
	SyncFailures int64 `json:"sync_failures"`
	Reachable    bool  `json:"reachable"`
	// Tenants are the tenants seen recently, by id.
	Tenants map[string]RegionStatus `json:"tenants"`
}

// Report returns the node's regional view.
func (r *Region) Report() RegionReport {
	ok, failed := r.Syncs()
	rep := RegionReport{Region: r.opt.Name, Regions: r.opt.Regions, Interval: r.opt.Interval, Floor: r.floor,
		Syncs: ok, SyncFailures: failed, Reachable: !r.down.Load(), Tenants: map[string]RegionStatus{}}
	r.tenants.Range(func(k, v any) bool {
		rt := v.(*regionTenant)
		rep.Tenants[k.(string)] = r.RegionStatus(k.(string), Limits{TokensPerMinute: rt.gTok.Load(),
			RequestsPerMinute: rt.gReq.Load(), MaxConcurrency: int(rt.gConc.Load())})
		return true
	})
	return rep
}
