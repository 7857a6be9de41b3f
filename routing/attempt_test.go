package routing

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// begin counts a request on b the way Acquire does; the returned function
// ends it (once, however often it is called).
func begin(b *Backend) (end func()) {
	b.begin()
	var done atomic.Bool
	return func() {
		if done.CompareAndSwap(false, true) {
			b.end()
		}
	}
}

// An attempt counts on its backend from Acquire to End, once, whatever
// the number of End calls.
func TestAttemptCountsUntilEnd(t *testing.T) {
	p, _ := NewPool(quiet("http://a:1"))
	b := p.Backends()[0]
	a, err := p.Acquire(context.Background(), Want{})
	if err != nil || a.Backend() != b || a.Waited() != 0 {
		t.Fatalf("acquire: %v %v waited %v; want backend a at once", a, err, a.Waited())
	}
	if b.InFlight() != 1 {
		t.Fatalf("in flight %d after Acquire; want 1", b.InFlight())
	}
	a.End(Finished)
	a.End(Failed)
	if b.InFlight() != 0 || b.failures.Load() != 0 {
		t.Fatalf("in flight %d, failures %d after End twice; want 0 and 0 (only the first End counts)",
			b.InFlight(), b.failures.Load())
	}
}

// Failed attempts eject the backend after eject_after in a row; an attempt
// that answered (Progress) starts the count again; Finished counts nothing.
func TestAttemptOutcomesDriveHealth(t *testing.T) {
	pc := quiet("http://a:1", "http://b:1")
	pc.EjectAfter = 2
	p, _ := NewPool(pc)
	a := p.Backends()[0]
	only := func() *Attempt {
		t.Helper()
		at, err := p.Acquire(context.Background(), Want{Tried: p.Backends()[1:]})
		if err != nil || at.Backend() != a {
			t.Fatalf("acquire: %v; want backend a", err)
		}
		return at
	}
	only().End(Failed)
	ok := only()
	ok.Progress(time.Now())
	ok.End(Finished)
	only().End(Failed)
	only().End(Finished)
	if !a.Healthy(time.Now()) {
		t.Fatal("ejected after failure, success, failure: the success did not reset the count")
	}
	only().End(Failed)
	if a.Healthy(time.Now()) {
		t.Fatal("not ejected after two failures in a row")
	}
	if _, err := p.Acquire(context.Background(), Want{Tried: p.Backends()[1:]}); !errors.Is(err, ErrNoHealthyBackend) {
		t.Fatalf("acquire with the only candidate ejected: %v; want ErrNoHealthyBackend", err)
	}
}

// Observe takes an endpoint-load-metrics header as a fresh sample.
func TestAttemptObserveLoadHeader(t *testing.T) {
	p, _ := NewPool(quiet("http://a:1"))
	a, err := p.Acquire(context.Background(), Want{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.End(Finished)
	now := time.Now()
	h := http.Header{"Endpoint-Load-Metrics": {"TEXT named_metrics.num_requests_waiting=7, named_metrics.num_requests_running=2"}}
	a.Observe(h, now)
	if l := a.Backend().Load(now); l.Sample == nil || l.Sample.Source != SourceHeader || l.Waiting != 7 {
		t.Fatalf("load %+v; want the header's sample, 7 waiting", l)
	}
}

// A queued attempt holds the pool's capacity from its grant until it has
// begun on the backend; its End wakes the next waiter, whose wait it
// reports.
func TestAttemptQueues(t *testing.T) {
	p, b := capped(t, nil)
	first, err := p.Acquire(context.Background(), Want{Queue: true, Tenant: "t"})
	if err != nil || first.Waited() != 0 {
		t.Fatalf("first: %v after %v; want at once", err, first.Waited())
	}
	if g := p.queue.granted.Load(); g != 0 {
		t.Fatalf("granted %d after Acquire; want 0 (the hold passes to the backend's count)", g)
	}
	got := make(chan *Attempt, 1)
	go func() {
		a, err := p.Acquire(context.Background(), Want{Queue: true, Tenant: "u"})
		if err != nil {
			t.Error(err)
		}
		got <- a
	}()
	waitFor(t, 3*time.Second, "the second request to wait", func() bool { return p.queue.waiting.Load() == 1 })
	first.End(Finished)
	second := <-got
	if second == nil {
		return
	}
	defer second.End(Finished)
	if second.Backend() != b || second.Waited() <= 0 {
		t.Fatalf("second: backend %v waited %v; want b after a wait", second.Backend(), second.Waited())
	}
}

// An attempt that gives up in the queue says how long it waited and when
// to retry.
func TestAttemptQueueTimeoutCarriesWait(t *testing.T) {
	p, _ := capped(t, func(pc *PoolConfig) { pc.Queue.MaxWait = 30 * time.Millisecond })
	first, err := p.Acquire(context.Background(), Want{Queue: true})
	if err != nil {
		t.Fatal(err)
	}
	defer first.End(Finished)
	a, err := p.Acquire(context.Background(), Want{Queue: true})
	if a != nil || !errors.Is(err, ErrQueueTimeout) || RetryAfter(err) < time.Second || QueueWait(err) <= 0 {
		t.Fatalf("attempt %v, err %v, retry after %v, waited %v; want ErrQueueTimeout with both",
			a, err, RetryAfter(err), QueueWait(err))
	}
	if QueueWait(ErrNoHealthyBackend) != 0 {
		t.Fatal("QueueWait of an error without a wait is not 0")
	}
}

// Retries and hedges (Queue false) never wait in the queue: with the only
// backend at its cap, they fail at once where a queued attempt would wait.
func TestAttemptUnqueuedSkipsQueue(t *testing.T) {
	p, _ := capped(t, nil)
	first, err := p.Acquire(context.Background(), Want{Queue: true})
	if err != nil {
		t.Fatal(err)
	}
	defer first.End(Finished)
	a, err := p.Acquire(context.Background(), Want{})
	if a != nil || !errors.Is(err, ErrNoHealthyBackend) || QueueWait(err) != 0 {
		t.Fatalf("unqueued attempt %v, err %v, waited %v; want ErrNoHealthyBackend at once", a, err, QueueWait(err))
	}
}

// A backend that answers and then aborts every stream mid-way (issue 20)
// is ejected like one that never answers: the first event no longer counts
// as a success that resets the failures.
func TestAttemptMidStreamFailuresEject(t *testing.T) {
	pc := quiet("http://a:1", "http://b:1")
	pc.EjectAfter = 3
	p, _ := NewPool(pc)
	a := p.Backends()[0]
	for i := 0; i < 3; i++ {
		at, err := p.Acquire(context.Background(), Want{Tried: p.Backends()[1:]})
		if err != nil || at.Backend() != a {
			t.Fatalf("acquire %d: %v; want backend a", i, err)
		}
		at.Progress(time.Now()) // headers and a few events, then the abort
		at.Progress(time.Now())
		at.End(Failed)
	}
	if a.Healthy(time.Now()) {
		t.Fatal("not ejected after three streams aborted mid-way")
	}
}
