package limiter

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Re-settling after a master change (issue 19 item 4).
//
// A Sentinel failover promotes the replica before go-redis switches to it
// (on +switch-master, at the end of the failover): the settles (and
// abandons) the old master takes in between are lost with its writes, and
// the leases they ended would stay on the new master until they expire
// unrenewed, within LeaseTTL. A Redis that restarts from a persistence
// file loses its last writes the same way. So the limiter keeps the
// settles it sent in the last LeaseTTL (a bounded ring) and, when it sees
// the Redis it talks to change (another run_id on a new connection), sends
// them again: settle.lua in resend mode applies a settle only to an
// admission record still unsettled (an "s" or "x" record, or none, leaves
// it a no-op), so a settle the new master already has is not applied
// twice and one it lacks frees its slot at once.

// maxRecent bounds the settles kept for a resend. Each entry is a
// pendingSettle (56 bytes) holding its *Ticket (about 250 bytes with its
// plan and strings): at most about 5 MiB.
const maxRecent = 16384

// resettleTimeout bounds one resend pass (heartbeat and settles).
const resettleTimeout = 2 * time.Second

// resettleAgain is when the second resend pass runs after a master
// change: settles still in flight to the old master at the first pass
// (sent on a connection opened before the switch) are in the ring by then.
const resettleAgain = time.Second

// recentRing is the bounded record of the settles sent in the last
// LeaseTTL; the oldest entry is dropped when it is full.
type recentRing struct {
	mu    sync.Mutex
	buf   []pendingSettle // len maxRecent once the first entry is added
	next  int             // where the next entry goes
	count int
}

// add records ps, dropping the oldest entry when the ring is full.
func (g *recentRing) add(ps pendingSettle) {
	g.mu.Lock()
	if g.buf == nil {
		g.buf = make([]pendingSettle, maxRecent)
	}
	g.buf[g.next] = ps
	g.next = (g.next + 1) % len(g.buf)
	g.count = min(g.count+1, len(g.buf))
	g.mu.Unlock()
}

// since returns the entries recorded at or after t, oldest first.
func (g *recentRing) since(t time.Time) []pendingSettle {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]pendingSettle, 0, g.count)
	for i := range g.count {
		ps := g.buf[(g.next-g.count+i+len(g.buf))%len(g.buf)]
		if !ps.since.Before(t) {
			out = append(out, ps)
		}
	}
	return out
}

// serverWatch tells the limiter when the Redis behind the client changes:
// its onConnect (go-redis' OnConnect hook, called on each new connection)
// reads the server's run_id and signals changed when it differs from the
// last one seen.
type serverWatch struct {
	mu      sync.Mutex
	runID   string
	changed chan struct{} // capacity 1
}

func newServerWatch() *serverWatch { return &serverWatch{changed: make(chan struct{}, 1)} }

// runIDScript returns the server's run_id. A script, not INFO itself:
// go-redis v9.23.0 (sentinel.go sentinelOptions) gives the OnConnect hook
// to the connections to the sentinels too, and a sentinel answers INFO
// with its own run_id but refuses EVAL, so only data nodes are seen. EVAL,
// not EVALSHA: a new connection may meet an empty script cache. The user
// needs INFO allowed, as admit.lua already does (docs/OPERATIONS.md).
var runIDScript = `return string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or ''`

// onConnect is the go-redis OnConnect hook (v9.23.0 options.go: "Hook
// that is called when new connection is established"). A reply error (a
// sentinel refusing EVAL, an ACL without INFO) does not fail the
// connection; a network error or timeout does, so that go-redis drops a
// connection that may still owe the reply.
func (w *serverWatch) onConnect(ctx context.Context, cn *redis.Conn) error {
	id, err := cn.Eval(ctx, runIDScript, nil).Text()
	var reply redis.Error
	if err != nil && !errors.As(err, &reply) {
		return err
	}
	if err != nil || id == "" {
		return nil
	}
	w.see(id)
	return nil
}

// see notes run_id id and signals a change from a known one.
func (w *serverWatch) see(id string) {
	w.mu.Lock()
	old := w.runID
	w.runID = id
	w.mu.Unlock()
	if old != "" && old != id {
		select {
		case w.changed <- struct{}{}:
		default:
		}
	}
}

// watchChanges returns the channel of master changes (nil, never ready,
// without a watch).
func (r *Redis) watchChanges() <-chan struct{} {
	if r.watch == nil {
		return nil
	}
	return r.watch.changed
}

// recordSent keeps ps for a resend after a master change.
func (r *Redis) recordSent(ps pendingSettle) {
	ps.since = time.Now()
	r.recent.add(ps)
}

// resettle runs after a master change: a heartbeat now (re-asserting the
// live leases, sending the queued settles) and then every settle and
// abandon sent in the last LeaseTTL again, in resend mode, in pipelines of
// 1000; bounded by resettleTimeout. It returns the number resent.
func (r *Redis) resettle(ctx context.Context) int {
	ctx, cancel := context.WithTimeout(ctx, resettleTimeout)
	defer cancel()
	_ = r.Beat(ctx)
	recent := r.recent.since(time.Now().Add(-r.opt.LeaseTTL))
	if len(recent) == 0 {
		return 0
	}
	// An id admitted again by this node since (a new admission of a reused
	// id) is live: its old settle must not end the new lease.
	r.mu.Lock()
	live := make(map[[2]string]struct{}, len(r.live))
	for t := range r.live {
		live[[2]string{t.Tenant, t.ID}] = struct{}{}
	}
	r.mu.Unlock()
	calls := make([]*scriptCall, 0, len(recent))
	for _, ps := range recent {
		if _, ok := live[[2]string{ps.t.Tenant, ps.t.ID}]; ok {
			continue
		}
		sc := r.settleCall(ps)
		sc.args = append(sc.args, "resend")
		calls = append(calls, sc)
	}
	n := len(calls)
	for len(calls) > 0 && ctx.Err() == nil {
		k := min(len(calls), 1000)
		_ = runPipeline(ctx, r.client, calls[:k])
		calls = calls[k:]
	}
	return n
}
