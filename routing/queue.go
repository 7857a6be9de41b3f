package routing

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Errors of the admission queue; both carry a retry delay (RetryAfter).
var (
	// ErrQueueTimeout means a request waited max_queue_wait without a
	// backend falling below target.
	ErrQueueTimeout = errors.New("timed out waiting in the admission queue")
	// ErrQueueFull means max_queue_length requests were already waiting.
	ErrQueueFull = errors.New("the admission queue is full")
)

type queueError struct {
	err        error
	retryAfter time.Duration
}

func (e *queueError) Error() string             { return e.err.Error() }
func (e *queueError) Unwrap() error             { return e.err }
func (e *queueError) RetryAfter() time.Duration { return e.retryAfter }

// admission is a request's pass through a pool's admission queue. From the
// moment it is granted it holds one unit of the pool's capacity, so that a
// burst of grants cannot overshoot the target; call Done once the request
// has begun on a backend (Pool.Acquire does both), or when it gives up.
// The zero admission (the pool does not queue) is valid and Done does nothing.
type admission struct {
	// Waited is how long the request waited in the queue (also when it
	// gave up or timed out); zero when it went straight through.
	Waited time.Duration

	q *queue
}

// Done releases the admission's hold on the pool's capacity. It is
// idempotent; it is not safe for simultaneous use.
func (a *admission) Done() {
	if q := a.q; q != nil {
		a.q = nil
		q.granted.Add(-1)
		q.signal()
	}
}

// Class indexes: interactive is served first.
const (
	classInteractive = iota
	classBatch
	numClasses
)

func classIndex(class string) int {
	if class == ClassBatch {
		return classBatch
	}
	return classInteractive
}

var classNames = [numClasses]string{ClassInteractive, ClassBatch}

// Outcomes of an Enter, counted per class.
const (
	outcomeImmediate = iota // went straight through
	outcomeWaited           // granted after waiting
	outcomeTimeout
	outcomeCancelled // the client went away while queued
	outcomeFull
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"immediate", "waited", "timeout", "cancelled", "full"}

// queue is a pool's admission queue: strict priority between classes,
// round robin between tenants within a class, FIFO within a tenant.
type queue struct {
	pool    *Pool
	cfg     QueueConfig
	enabled bool

	waiting atomic.Int64 // queued, not yet granted
	granted atomic.Int64 // granted, not yet Done

	mu      sync.Mutex
	classes [numClasses]classQueue
	timer   *time.Timer
	closed  bool

	depth    [numClasses]atomic.Int64
	waits    [numClasses]prometheus.Histogram
	outcomes [numClasses][numOutcomes]atomic.Int64
}

type classQueue struct {
	tenants map[string]*tenantQueue
	ring    list.List // of *tenantQueue with waiters, in turn order
}

type tenantQueue struct {
	name    string
	waiters list.List     // of *waiter, FIFO
	turn    *list.Element // in the class ring
}

type waiter struct {
	class   int
	tq      *tenantQueue
	elem    *list.Element
	ready   chan struct{} // closed when granted
	granted bool          // guarded by queue.mu
}

// queueWaitBuckets span 1 ms to ~65 s.
var queueWaitBuckets = prometheus.ExponentialBuckets(0.001, 2, 17)

func newQueue(p *Pool) *queue {
	q := &queue{pool: p, cfg: p.cfg.Queue}
	q.enabled = q.cfg.MaxWaiting > 0 || q.cfg.TargetUtilization > 0
	for _, b := range p.backends {
		q.enabled = q.enabled || b.Config.MaxConcurrency > 0
	}
	for c := range q.classes {
		q.classes[c].tenants = map[string]*tenantQueue{}
		q.waits[c] = prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sluice_queue_wait_seconds", Help: "Time requests waited in the pool's admission queue.",
			ConstLabels: prometheus.Labels{"pool": p.cfg.Name, "class": classNames[c]}, Buckets: queueWaitBuckets,
		})
	}
	return q
}

// enter admits a request of a traffic class ("interactive" or "batch") from
// a tenant to the pool: at once while some healthy backend is below the
// queue's target and nobody waits, else after waiting its turn. It fails
// with ErrQueueTimeout after max_queue_wait, ErrQueueFull when the queue
// is at max_queue_length, ErrNoHealthyBackend when no backend is healthy,
// or ctx's cause when ctx is done first (the request leaves the queue at
// once). A pool without targets admits everything at once.
func (p *Pool) enter(ctx context.Context, class, tenant string) (admission, error) {
	q := p.queue
	if !q.enabled {
		return admission{}, nil
	}
	c, start := classIndex(class), time.Now()
	q.mu.Lock()
	if q.waiting.Load() == 0 && q.roomLocked(start) > 0 {
		q.granted.Add(1)
		q.mu.Unlock()
		q.observe(c, outcomeImmediate, 0)
		return admission{q: q}, nil
	}
	if !p.anyHealthy(start) {
		q.mu.Unlock()
		return admission{}, &unavailableError{retryAfter: p.nextHealthy(start)}
	}
	if q.waiting.Load() >= int64(q.cfg.MaxLength) {
		q.mu.Unlock()
		q.observe(c, outcomeFull, -1)
		return admission{}, &queueError{ErrQueueFull, time.Second}
	}
	w := q.pushLocked(c, tenant)
	q.armLocked(start)
	q.mu.Unlock()
	return q.wait(ctx, w, start)
}

// wait blocks until w is granted, the deadline passes or ctx is done.
func (q *queue) wait(ctx context.Context, w *waiter, start time.Time) (admission, error) {
	t := time.NewTimer(q.cfg.MaxWait)
	defer t.Stop()
	var err error
	outcome := outcomeTimeout
	select {
	case <-w.ready:
	case <-t.C:
		err = &queueError{ErrQueueTimeout, time.Second}
	case <-ctx.Done():
		err, outcome = context.Cause(ctx), outcomeCancelled
	}
	q.mu.Lock()
	granted := w.granted
	if !granted {
		q.removeLocked(w)
	}
	q.mu.Unlock()
	if granted && ctx.Err() == nil { // granted, perhaps as the deadline passed: take it
		waited := time.Since(start)
		q.observe(w.class, outcomeWaited, waited)
		return admission{Waited: waited, q: q}, nil
	}
	if granted { // the client left as it was granted: pass the capacity on
		q.granted.Add(-1)
		q.signal()
	}
	q.observe(w.class, outcome, -1)
	return admission{Waited: time.Since(start)}, err
}

func (q *queue) observe(c, outcome int, waited time.Duration) {
	q.outcomes[c][outcome].Add(1)
	if waited >= 0 {
		q.waits[c].Observe(waited.Seconds())
	}
}

// signal wakes waiters if capacity may have freed: a request ended, a
// sample arrived, a backend came back. It costs one atomic load when
// nobody waits.
func (q *queue) signal() {
	if q == nil || q.waiting.Load() == 0 {
		return
	}
	q.mu.Lock()
	q.pumpLocked(time.Now())
	q.mu.Unlock()
}

// pumpLocked grants as many waiters as the pool has room for, in priority
// order, and arms the timer for time-driven changes while some still wait.
func (q *queue) pumpLocked(now time.Time) {
	if q.waiting.Load() == 0 {
		return
	}
	for room := q.roomLocked(now); room > 0; room-- {
		w := q.popLocked()
		if w == nil {
			break
		}
		w.granted = true
		q.granted.Add(1)
		close(w.ready)
	}
	if q.waiting.Load() > 0 {
		q.armLocked(now)
	}
}

// roomLocked is how many more requests the pool takes before every
// healthy backend is at target, less the grants not yet begun.
func (q *queue) roomLocked(now time.Time) int {
	total := 0
	for _, b := range q.pool.backends {
		r := b.room(now, q.cfg)
		if r >= unlimited {
			return unlimited
		}
		total += r
	}
	return total - int(q.granted.Load())
}

// preferRoom narrows cands to those below target when there are any. It
// reorders cands in place.
func (q *queue) preferRoom(cands []*Backend, now time.Time) []*Backend {
	n := 0
	for _, c := range cands {
		if c.room(now, q.cfg) > 0 {
			cands[n] = c
			n++
		}
	}
	if n == 0 {
		return cands
	}
	return cands[:n]
}

// armLocked sets the timer to the next time-driven change in the pool's
// room (a sample going stale, an ejection ending), at most stale_after
// away, so that waiters are not stranded when no event comes.
func (q *queue) armLocked(now time.Time) {
	if q.closed {
		return
	}
	stale := q.pool.cfg.StaleAfter
	d := stale
	for _, b := range q.pool.backends {
		if s := b.sample(now); s != nil {
			d = min(d, s.At.Add(stale).Sub(now)+time.Millisecond)
		}
		if until := time.Unix(0, b.ejectedUntil.Load()); until.After(now) {
			d = min(d, until.Sub(now)+time.Millisecond)
		}
	}
	d = max(d, time.Millisecond)
	if q.timer == nil {
		q.timer = time.AfterFunc(d, q.signal)
	} else {
		q.timer.Reset(d)
	}
}

func (q *queue) pushLocked(c int, tenant string) *waiter {
	cq := &q.classes[c]
	tq := cq.tenants[tenant]
	if tq == nil {
		tq = &tenantQueue{name: tenant}
		cq.tenants[tenant] = tq
	}
	w := &waiter{class: c, tq: tq, ready: make(chan struct{})}
	w.elem = tq.waiters.PushBack(w)
	if tq.turn == nil {
		tq.turn = cq.ring.PushBack(tq)
	}
	q.waiting.Add(1)
	q.depth[c].Add(1)
	return w
}

// popLocked takes the next waiter: the first class with waiters, the
// tenant whose turn it is, its oldest request. The tenant goes to the back
// of the ring.
func (q *queue) popLocked() *waiter {
	for c := range q.classes {
		cq := &q.classes[c]
		e := cq.ring.Front()
		if e == nil {
			continue
		}
		tq := e.Value.(*tenantQueue)
		w := tq.waiters.Remove(tq.waiters.Front()).(*waiter)
		cq.ring.Remove(e)
		tq.turn = nil
		if tq.waiters.Len() > 0 {
			tq.turn = cq.ring.PushBack(tq)
		} else {
			delete(cq.tenants, tq.name)
		}
		w.elem = nil
		q.waiting.Add(-1)
		q.depth[c].Add(-1)
		return w
	}
	return nil
}

// removeLocked takes a waiter that gave up out of the queue.
func (q *queue) removeLocked(w *waiter) {
	if w.elem == nil {
		return
	}
	tq, cq := w.tq, &q.classes[w.class]
	tq.waiters.Remove(w.elem)
	w.elem = nil
	if tq.waiters.Len() == 0 {
		cq.ring.Remove(tq.turn)
		tq.turn = nil
		delete(cq.tenants, tq.name)
	}
	q.waiting.Add(-1)
	q.depth[w.class].Add(-1)
}

// close stops the timer; waiters still wake on events or time out.
func (q *queue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	if q.timer != nil {
		q.timer.Stop()
	}
}

// QueueLen returns the number of requests waiting in the pool's admission
// queue, per class ("interactive", "batch").
func (p *Pool) QueueLen(class string) int {
	return int(p.queue.depth[classIndex(class)].Load())
}
