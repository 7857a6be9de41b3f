package limiter

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// doneCount counts SettleDone calls and keeps the last error.
type doneCount struct {
	n    atomic.Int64
	mu   sync.Mutex
	errs []error
}

func (d *doneCount) SettleDone(err error) {
	d.n.Add(1)
	if err != nil {
		d.mu.Lock()
		d.errs = append(d.errs, err)
		d.mu.Unlock()
	}
}

// A local ticket settles in the caller's goroutine: done before Settle
// returns, and the slot free again.
func TestSettleQueueLocalRunsAtOnce(t *testing.T) {
	q := NewSettleQueue(0, 0, 0)
	l := NewLocal(1)
	req := Request{Tenant: "t", Limits: Limits{MaxConcurrency: 1}}
	var done doneCount
	for i := 0; i < 3; i++ {
		d := admit(t, l, req)
		if !d.Allowed {
			t.Fatalf("admission %d refused: the previous settle had not run", i)
		}
		q.Settle(l, d.Ticket, Usage{}, 0, &done)
		if done.n.Load() != int64(i+1) {
			t.Fatalf("settle %d not done when Settle returned", i)
		}
	}
	if q.workers.Load() != 0 {
		t.Fatal("a worker started for local settles")
	}
}

// On a healthy Redis the caller waits for the settle (the lease is gone
// when Settle returns); on a paused one it waits no longer than its bound,
// the settle runs later, and Wait waits for it.
func TestSettleQueueWaitsBoundedForRedis(t *testing.T) {
	srv := startRedis(t)
	r := newRedis(t, srv.Addr(), RedisOptions{})
	readyScope(t, srv, "q")
	q := NewSettleQueue(0, 0, 5*time.Second)
	req := Request{Tenant: "q", Limits: Limits{MaxConcurrency: 5}}
	var done doneCount
	d := admit(t, r, req)
	q.Settle(r, d.Ticket, Usage{}, 2*time.Second, &done)
	if done.n.Load() != 1 || leases(t, srv, "q") != 0 {
		t.Fatalf("healthy Redis: done %d, %d leases when Settle returned; want the settle run", done.n.Load(), leases(t, srv, "q"))
	}

	d = admit(t, r, req)
	srv.Pause()
	start := time.Now()
	q.Settle(r, d.Ticket, Usage{}, 20*time.Millisecond, &done)
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Fatalf("Settle on a paused Redis took %v; want about its 20ms bound", took)
	}
	if done.n.Load() != 1 {
		t.Fatal("settle reported done while Redis is paused")
	}
	srv.Resume()
	q.Wait()
	if done.n.Load() != 2 || leases(t, srv, "q") != 0 || len(done.errs) != 0 {
		t.Fatalf("after Wait: done %d, %d leases, errors %v; want the settle run", done.n.Load(), leases(t, srv, "q"), done.errs)
	}
}

// slowSettler is a store whose settles take a while; it counts the ones
// running at once.
type slowSettler struct {
	d            time.Duration
	running, max atomic.Int64
	settled      atomic.Int64
}

func (s *slowSettler) Settle(ctx context.Context, t *Ticket, u Usage) error {
	n := s.running.Add(1)
	for m := s.max.Load(); n > m && !s.max.CompareAndSwap(m, n); m = s.max.Load() {
	}
	time.Sleep(s.d)
	s.running.Add(-1)
	s.settled.Add(1)
	return nil
}

// A burst larger than the queue: every settle runs exactly once, none is
// dropped, the callers never block, the workers stay within their bound
// (the overflow runs on its own goroutines) and exit when idle.
func TestSettleQueueBurstNeverDrops(t *testing.T) {
	s := &slowSettler{d: time.Millisecond}
	q := NewSettleQueue(64, 4, time.Second)
	var done doneCount
	const n = 2000
	start := time.Now()
	for i := 0; i < n; i++ {
		q.Settle(s, &Ticket{ID: "x"}, Usage{}, 0, &done)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("handing %d settles took %v; callers must not block", n, took)
	}
	q.Wait()
	if s.settled.Load() != n || done.n.Load() != n {
		t.Fatalf("settled %d, done %d; want %d each", s.settled.Load(), done.n.Load(), n)
	}
	if w := q.workers.Load(); w > 4 {
		t.Fatalf("%d workers; want at most 4", w)
	}
	deadline := time.Now().Add(idleExit + 3*time.Second)
	for q.workers.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d workers still running %v after the last settle", q.workers.Load(), idleExit+3*time.Second)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Work after the workers left starts one again.
	q.Settle(s, &Ticket{ID: "y"}, Usage{}, time.Second, &done)
	if done.n.Load() != n+1 {
		t.Fatal("a settle after the workers exited did not run")
	}
}
