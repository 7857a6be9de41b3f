package routing

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// capped is a quiet pool of one backend taking one request at a time.
func capped(t *testing.T, mod func(*PoolConfig)) (*Pool, *Backend) {
	t.Helper()
	pc := quiet("http://a:1")
	pc.Backends[0].MaxConcurrency = 1
	if mod != nil {
		mod(&pc)
	}
	p, err := NewPool(pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, p.Backends()[0]
}

// occupy admits and begins one request; the returned function ends it.
func occupy(t *testing.T, p *Pool, b *Backend) func() {
	t.Helper()
	adm, err := p.enter(context.Background(), ClassInteractive, "x")
	if err != nil || adm.Waited != 0 {
		t.Fatalf("enter: %v after %v; want at once", err, adm.Waited)
	}
	end := begin(b)
	adm.Done()
	return end
}

type served struct {
	label string
	end   func()
}

// Interactive before batch, tenants in turn within a class, FIFO within a
// tenant.
func TestQueueOrder(t *testing.T) {
	p, b := capped(t, nil)
	end := occupy(t, p, b)
	out := make(chan served, 16)
	enqueue := func(class, tenant, label string) {
		before := p.QueueLen(ClassInteractive) + p.QueueLen(ClassBatch)
		go func() {
			adm, err := p.enter(context.Background(), class, tenant)
			if err != nil {
				out <- served{label: "error " + err.Error()}
				return
			}
			e := begin(b)
			adm.Done()
			out <- served{label, e}
		}()
		waitFor(t, 2*time.Second, label+" to queue", func() bool {
			return p.QueueLen(ClassInteractive)+p.QueueLen(ClassBatch) == before+1
		})
	}
	enqueue(ClassBatch, "A", "bA1")
	enqueue(ClassBatch, "A", "bA2")
	enqueue(ClassInteractive, "A", "iA1")
	enqueue(ClassInteractive, "A", "iA2")
	enqueue(ClassInteractive, "A", "iA3")
	enqueue(ClassBatch, "B", "bB1")
	enqueue(ClassInteractive, "B", "iB1")
	var got []string
	end()
	for i := 0; i < 7; i++ {
		select {
		case s := <-out:
			got = append(got, s.label)
			s.end()
		case <-time.After(5 * time.Second):
			t.Fatalf("served %v, then nothing", got)
		}
	}
	if want := "iA1 iB1 iA2 iA3 bA1 bB1 bA2"; strings.Join(got, " ") != want {
		t.Fatalf("served %q; want %q", strings.Join(got, " "), want)
	}
}

// One tenant's burst does not starve another that arrives later.
func TestQueueTenantFairness(t *testing.T) {
	p, b := capped(t, nil)
	end := occupy(t, p, b)
	out := make(chan served, 64)
	start := func(tenant string, n int) {
		for i := 0; i < n; i++ {
			before := p.QueueLen(ClassInteractive)
			go func() {
				adm, err := p.enter(context.Background(), ClassInteractive, tenant)
				if err != nil {
					out <- served{label: "error"}
					return
				}
				e := begin(b)
				adm.Done()
				out <- served{tenant, e}
			}()
			waitFor(t, 2*time.Second, "queueing", func() bool { return p.QueueLen(ClassInteractive) == before+1 })
		}
	}
	start("greedy", 20)
	start("small", 2)
	end()
	var order []string
	for i := 0; i < 22; i++ {
		s := <-out
		order = append(order, s.label)
		s.end()
	}
	// small's two requests go within the first four, not after 20.
	smallSeen := 0
	for _, l := range order[:4] {
		if l == "small" {
			smallSeen++
		}
	}
	if smallSeen != 2 {
		t.Fatalf("order %v; want both of small's requests among the first four", order)
	}
}

func TestQueueTimeoutAndFull(t *testing.T) {
	p, b := capped(t, func(pc *PoolConfig) {
		pc.Queue.MaxWait = 100 * time.Millisecond
		pc.Queue.MaxLength = 1
	})
	defer occupy(t, p, b)()
	errc := make(chan error, 1)
	var waited time.Duration
	go func() {
		adm, err := p.enter(context.Background(), ClassBatch, "t")
		waited = adm.Waited
		errc <- err
	}()
	waitFor(t, 2*time.Second, "the first to queue", func() bool { return p.QueueLen(ClassBatch) == 1 })
	if _, err := p.enter(context.Background(), ClassInteractive, "u"); !errors.Is(err, ErrQueueFull) || RetryAfter(err) < time.Second {
		t.Fatalf("second: %v; want ErrQueueFull with a retry delay", err)
	}
	err := <-errc
	if !errors.Is(err, ErrQueueTimeout) || RetryAfter(err) < time.Second || waited < 100*time.Millisecond {
		t.Fatalf("first: %v after %v; want ErrQueueTimeout with a retry delay after max_queue_wait", err, waited)
	}
	if p.QueueLen(ClassBatch) != 0 {
		t.Fatal("a timed-out request stayed in the queue")
	}
}

// A caller that goes away leaves the queue at once, and the depth metric
// says so.
func TestQueueCancelLeaves(t *testing.T) {
	p, b := capped(t, nil)
	defer occupy(t, p, b)()
	reg := prometheus.NewRegistry()
	if err := RegisterMetrics(reg, func() []*Pool { return []*Pool{p} }); err != nil {
		t.Fatal(err)
	}
	depth := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "sluice_queue_depth" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "class" && l.GetValue() == ClassInteractive {
						return m.GetGauge().GetValue()
					}
				}
			}
		}
		return -1
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := p.enter(ctx, ClassInteractive, "t")
		errc <- err
	}()
	waitFor(t, 2*time.Second, "queue depth 1", func() bool { return depth() == 1 })
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v; want context.Canceled", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a cancelled caller stayed queued")
	}
	if d := depth(); d != 0 {
		t.Fatalf("queue depth %v after the caller left; want 0", d)
	}
	if n := p.queue.outcomes[classInteractive][outcomeCancelled].Load(); n != 1 {
		t.Fatalf("cancelled outcomes %d; want 1", n)
	}
}

// A scrape that shows room wakes waiters: no request needs to end.
func TestQueueWakesOnSample(t *testing.T) {
	g := startGauged(t)
	g.set(func(g *gauged) { g.waiting, g.running = 5, 8 })
	cfg := PoolConfig{Name: "p", ScrapeInterval: 20 * time.Millisecond, Health: HealthConfig{Disable: true},
		Queue:    QueueConfig{MaxWaiting: 2, MaxWait: 10 * time.Second},
		Backends: []BackendConfig{{URL: g.srv.URL}}}
	p := startPool(t, cfg)
	b := p.Backends()[0]
	waitFor(t, 3*time.Second, "a sample", func() bool { return b.Load(time.Now()).Known })
	admc := make(chan error, 1)
	go func() {
		adm, err := p.enter(context.Background(), ClassInteractive, "t")
		adm.Done()
		admc <- err
	}()
	waitFor(t, 2*time.Second, "the request to queue", func() bool { return p.QueueLen(ClassInteractive) == 1 })
	g.set(func(g *gauged) { g.waiting = 0 })
	select {
	case err := <-admc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the queue did not wake when a scrape showed room")
	}
}

// target_utilization of max_batch: room is the slots below the target.
func TestQueueTargetUtilization(t *testing.T) {
	pc := quiet("http://a:1")
	pc.Backends[0].MaxBatch = 10
	pc.Queue.TargetUtilization = 0.5
	p, err := NewPool(pc)
	if err != nil {
		t.Fatal(err)
	}
	b := p.Backends()[0]
	var ends []func()
	for i := 0; i < 5; i++ {
		ends = append(ends, occupy(t, p, b))
	}
	done := make(chan time.Duration, 1)
	go func() {
		adm, err := p.enter(context.Background(), ClassInteractive, "t")
		if err != nil {
			done <- -1
			return
		}
		defer begin(b)()
		adm.Done()
		done <- adm.Waited
	}()
	waitFor(t, 2*time.Second, "the sixth to queue", func() bool { return p.QueueLen(ClassInteractive) == 1 })
	ends[0]()
	select {
	case w := <-done:
		if w <= 0 {
			t.Fatalf("waited %v; want a positive wait", w)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("an ending request did not wake the queue")
	}
	for _, e := range ends[1:] {
		e()
	}
}

// With no healthy backend the queue answers at once; without targets it
// is not used at all.
func TestQueueFastPaths(t *testing.T) {
	p, b := capped(t, nil)
	b.report(false, time.Now())
	b.report(false, time.Now())
	b.report(false, time.Now())
	start := time.Now()
	if _, err := p.enter(context.Background(), ClassInteractive, "t"); !errors.Is(err, ErrNoHealthyBackend) {
		t.Fatalf("got %v; want ErrNoHealthyBackend", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("took %v; want a fast answer", d)
	}
	free, _ := NewPool(quiet("http://a:1"))
	for i := 0; i < 100; i++ {
		defer begin(free.Backends()[0])()
		adm, err := free.enter(context.Background(), ClassBatch, fmt.Sprint(i))
		if err != nil || adm.q != nil {
			t.Fatalf("pool without targets: %v %+v; want a zero admission", err, adm)
		}
	}
}
