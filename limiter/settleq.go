package limiter

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Settler is what a SettleQueue settles on: Local, Redis and Shared, or
// any limiter with their Settle contract.
type Settler interface {
	Settle(ctx context.Context, t *Ticket, u Usage) error
}

// SettleDone is told, once, that a settle handed to a SettleQueue has run,
// with its error.
type SettleDone interface {
	SettleDone(err error)
}

// SettleQueue settles the tickets of finished requests without a
// goroutine, channel or timer of their own (issue 20). A settle that needs
// no I/O (a Local ticket, or a Shared ticket decided without Redis) runs
// at once in the caller's goroutine. Any other goes into a bounded queue
// drained by at most MaxWorkers worker goroutines, which the queue starts
// when work arrives and which exit after idleExit without work; the
// caller waits for it up to a short bound (so a healthy store frees the
// slot before the client sees the end of the response), never longer.
// When the queue is full a settle runs on a goroutine of its own: it is
// never dropped and the caller never blocks. Safe for simultaneous use.
type SettleQueue struct {
	jobs       chan settleJob
	timeout    time.Duration
	maxWorkers int32
	workers    atomic.Int32
	pending    sync.WaitGroup
	signals    sync.Pool // chan struct{}, capacity 1, empty
	timers     sync.Pool // *time.Timer, stopped
}

type settleJob struct {
	lim  Settler
	t    *Ticket
	u    Usage
	done SettleDone
	sig  chan struct{} // told when the settle ran; nil: nobody waits
}

// Defaults of NewSettleQueue.
const (
	// DefaultSettleQueue bounds the settles waiting for a worker.
	DefaultSettleQueue = 4096
	// DefaultSettleWorkers bounds the worker goroutines: the settles in
	// flight to the store at once (each holds one Redis connection).
	DefaultSettleWorkers = 16
	// idleExit is how long a worker waits for work before it exits.
	idleExit = 2 * time.Second
)

// NewSettleQueue returns a queue of size settles drained by at most
// workers goroutines, each settle bounded by timeout. Zero values take the
// defaults (DefaultSettleQueue, DefaultSettleWorkers, 1s).
func NewSettleQueue(size, workers int, timeout time.Duration) *SettleQueue {
	if size <= 0 {
		size = DefaultSettleQueue
	}
	if workers <= 0 {
		workers = DefaultSettleWorkers
	}
	if timeout <= 0 {
		timeout = time.Second
	}
	return &SettleQueue{jobs: make(chan settleJob, size), timeout: timeout, maxWorkers: int32(workers)}
}

// SettlesLocally reports whether settling t needs no I/O: a ticket of a
// Local, or of a Shared that decided it without Redis (store-failure
// policies "local" and "open").
func SettlesLocally(t *Ticket) bool {
	switch impl := t.impl.(type) {
	case *Local:
		return true
	case *sharedTicket:
		if impl.inner == nil {
			return true
		}
		_, ok := impl.inner.impl.(*Local)
		return ok
	}
	return false
}

// Settle settles t on lim and then tells done (which may be nil). A local
// settle (SettlesLocally) runs now; any other is queued, and Settle
// returns when it has run or after wait, whichever comes first (wait <= 0:
// at once).
func (q *SettleQueue) Settle(lim Settler, t *Ticket, u Usage, wait time.Duration, done SettleDone) {
	if t == nil || SettlesLocally(t) {
		err := lim.Settle(context.Background(), t, u)
		if done != nil {
			done.SettleDone(err)
		}
		return
	}
	j := settleJob{lim: lim, t: t, u: u, done: done}
	if wait > 0 {
		j.sig = q.signal()
	}
	q.pending.Add(1)
	select {
	case q.jobs <- j:
		q.spawn()
	default: // full: never drop, never block
		go q.run(j) // exits when the settle has run
	}
	if j.sig == nil {
		return
	}
	tm := q.timer(wait)
	select {
	case <-j.sig:
		q.signals.Put(j.sig) // read: empty again
	case <-tm.C:
		// The worker will still tell sig; it is not reused.
	}
	tm.Stop()
	q.timers.Put(tm)
}

// Wait waits until every settle handed to q has run (each is bounded by
// the queue's timeout). Call it after the listeners have shut down and
// before the limiter stops.
func (q *SettleQueue) Wait() { q.pending.Wait() }

func (q *SettleQueue) signal() chan struct{} {
	if c, ok := q.signals.Get().(chan struct{}); ok {
		return c
	}
	return make(chan struct{}, 1)
}

// timer returns a timer that fires after d. Since Go 1.23 a stopped timer's
// channel holds no stale value, so a pooled one can be reset.
func (q *SettleQueue) timer(d time.Duration) *time.Timer {
	if tm, ok := q.timers.Get().(*time.Timer); ok {
		tm.Reset(d)
		return tm
	}
	return time.NewTimer(d)
}

// spawn starts a worker when fewer than maxWorkers run.
func (q *SettleQueue) spawn() {
	for {
		n := q.workers.Load()
		if n >= q.maxWorkers {
			return
		}
		if q.workers.CompareAndSwap(n, n+1) {
			go q.work() // exits after idleExit without work
			return
		}
	}
}

// work runs queued settles until none arrives for idleExit. A worker
// that leaves counts itself out first and then looks at the queue once
// more, so a settle queued while every worker was leaving is not
// stranded: either its submitter saw the count drop and started a
// worker, or a leaving worker sees it here.
func (q *SettleQueue) work() {
	idle := time.NewTimer(idleExit)
	defer idle.Stop()
	for {
		select {
		case j := <-q.jobs:
			q.run(j)
			idle.Reset(idleExit)
		case <-idle.C:
			q.workers.Add(-1)
			if len(q.jobs) == 0 {
				return
			}
			if q.workers.Add(1) > q.maxWorkers {
				q.workers.Add(-1)
				return
			}
			idle.Reset(idleExit)
		}
	}
}

func (q *SettleQueue) run(j settleJob) {
	defer q.pending.Done()
	ctx, cancel := context.WithTimeout(context.Background(), q.timeout)
	err := j.lim.Settle(ctx, j.t, j.u)
	cancel()
	if j.done != nil {
		j.done.SettleDone(err) // before the signal: a waiter returns with it done
	}
	if j.sig != nil {
		j.sig <- struct{}{} // capacity 1, one send: never blocks
	}
}
