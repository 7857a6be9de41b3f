package routing

import (
	"errors"
	"runtime"
	"testing"
	"time"
)

// A scraped sample is used while fresh; once stale or when the metrics
// cannot be read, the load is unknown and falls back to own in-flight
// requests: never to zero.
func TestLoadFallsBackToInFlight(t *testing.T) {
	g := startGauged(t)
	g.set(func(g *gauged) { g.waiting, g.running = 10, 5 })
	cfg := PoolConfig{Name: "p", ScrapeInterval: 20 * time.Millisecond, StaleAfter: 150 * time.Millisecond,
		Health: HealthConfig{Disable: true}, Backends: []BackendConfig{{URL: g.srv.URL}}}
	p := startPool(t, cfg)
	b := p.Backends()[0]
	waitFor(t, 3*time.Second, "a fresh sample", func() bool { return b.Load(time.Now()).Known })
	end1, end2 := begin(b), begin(b)
	defer end1()
	defer end2()
	l := b.Load(time.Now())
	if l.Total != 17 || l.Waiting != 12 || l.Sample.Dialect != DialectVLLM {
		t.Fatalf("fresh: total %v waiting %v (%+v); want 10+5 plus 2 dispatched since, waiting 12", l.Total, l.Waiting, l.Sample)
	}
	g.set(func(g *gauged) { g.metricsStatus = 500 })
	waitFor(t, 3*time.Second, "the sample to go stale", func() bool { return !b.Load(time.Now()).Known })
	l = b.Load(time.Now())
	if l.Total != 2 || l.Waiting != -1 || l.Sample != nil {
		t.Fatalf("stale: total %v waiting %v; want own in-flight 2 and waiting unknown", l.Total, l.Waiting)
	}
	if b.scrapeErrors.Load() == 0 {
		t.Fatal("failed scrapes were not counted")
	}
}

func TestLoadUnreachableMetrics(t *testing.T) {
	cfg := PoolConfig{Name: "p", ScrapeInterval: 10 * time.Millisecond, Health: HealthConfig{Disable: true},
		Backends: []BackendConfig{{URL: closedURL(t)}}}
	p := startPool(t, cfg)
	b := p.Backends()[0]
	waitFor(t, 3*time.Second, "scrape errors", func() bool { return b.scrapeErrors.Load() >= 2 })
	for i := 0; i < 3; i++ {
		defer begin(b)()
	}
	if l := b.Load(time.Now()); l.Known || l.Total != 3 || b.Score(time.Now()) != 3 {
		t.Fatalf("load %+v score %v; want unknown, own in-flight 3", l, b.Score(time.Now()))
	}
}

// A header sample newer than the scraped one wins; an older one does not.
func TestHeaderSampleFresherWins(t *testing.T) {
	p, _ := NewPool(quiet("http://127.0.0.1:1"))
	b := p.Backends()[0]
	now := time.Now()
	setSample(b, 1, 1, now.Add(-100*time.Millisecond))
	b.observeLoadHeader("TEXT named_metrics.num_requests_waiting=7, named_metrics.num_requests_running=2", now)
	if l := b.Load(now); l.Total != 9 || l.Sample.Source != SourceHeader {
		t.Fatalf("load %+v; want the header's 7+2", l)
	}
	setSample(b, 0, 4, now.Add(time.Millisecond))
	if l := b.Load(now.Add(time.Millisecond)); l.Total != 4 || l.Sample.Source != SourceScrape {
		t.Fatalf("load %+v; want the newer scrape's 0+4", l)
	}
	b.observeLoadHeader("TEXT unrelated=1", now.Add(time.Second))
	if l := b.Load(now.Add(time.Millisecond)); l.Sample.Source != SourceScrape {
		t.Fatal("an unreadable header replaced the sample")
	}
}

// Requests dispatched between two samples count, so a burst spreads over
// backends that all reported zero load.
func TestBurstBetweenSamplesSpreads(t *testing.T) {
	p, _ := NewPool(quiet("http://a:1", "http://b:1", "http://c:1"))
	now := time.Now()
	for _, b := range p.Backends() {
		setSample(b, 0, 0, now)
	}
	counts := map[*Backend]int{}
	for i := 0; i < 60; i++ {
		b, err := p.pick(nil)
		if err != nil {
			t.Fatal(err)
		}
		defer begin(b)()
		counts[b]++
	}
	for _, b := range p.Backends() {
		if counts[b] < 12 {
			t.Fatalf("burst of 60 split %d/%d/%d; want each backend ≥ 12", counts[p.backends[0]], counts[p.backends[1]], counts[p.backends[2]])
		}
	}
}

func TestLeastQueuedPrefersLowerScore(t *testing.T) {
	p, _ := NewPool(quiet("http://a:1", "http://b:1", "http://c:1"))
	bs := p.Backends()
	now := time.Now()
	setSample(bs[0], 10, 8, now) // busiest
	setSample(bs[1], 0, 4, now)
	setSample(bs[2], 0, 1, now) // idlest
	counts := map[*Backend]int{}
	for i := 0; i < 3000; i++ {
		b, _ := p.pick(nil)
		counts[b]++
	}
	// Power of two choices: the idlest wins both of its pairs (2/3), the
	// middle one its pair with the busiest (1/3), the busiest never.
	if counts[bs[0]] != 0 || counts[bs[2]] < 1800 || counts[bs[1]] < 800 {
		t.Fatalf("picks %d/%d/%d; want 0, ~1000, ~2000", counts[bs[0]], counts[bs[1]], counts[bs[2]])
	}
}

func TestScoreNormalisesByCapacity(t *testing.T) {
	pc := quiet("http://a:1", "http://b:1")
	pc.Backends[0].MaxBatch, pc.Backends[1].MaxBatch = 16, 4
	pc.Backends[1].Weight = 2
	p, _ := NewPool(pc)
	now := time.Now()
	a, b := p.Backends()[0], p.Backends()[1]
	setSample(a, 0, 8, now) // half its 16 slots
	setSample(b, 2, 4, now) // full, 2 waiting; 8 slot-units by weight
	if sa, sb := a.Score(now), b.Score(now); sa != 0.5 || sb != 1 {
		t.Fatalf("scores %v, %v; want 8/16 = 0.5 and (6+2)/(2×4) = 1", sa, sb)
	}
}

func TestSelectors(t *testing.T) {
	pc := quiet("http://a:1", "http://b:1", "http://c:1")
	pc.Backends[1].Weight = 2
	t.Run("round robin", func(t *testing.T) {
		pc.Policy = PolicyRoundRobin
		p, _ := NewPool(pc)
		var got []string
		for i := 0; i < 8; i++ {
			b, _ := p.pick(nil)
			got = append(got, b.URL.Hostname())
		}
		if want := "a b b c a b b c"; join(got) != want {
			t.Fatalf("order %q; want %q", join(got), want)
		}
	})
	t.Run("random", func(t *testing.T) {
		pc.Policy = PolicyRandom
		p, _ := NewPool(pc)
		counts := map[string]int{}
		for i := 0; i < 4000; i++ {
			b, _ := p.pick(nil)
			counts[b.URL.Hostname()]++
		}
		if counts["b"] < 1700 || counts["b"] > 2300 || counts["a"] < 700 || counts["c"] < 700 {
			t.Fatalf("counts %v; want about 1000/2000/1000", counts)
		}
	})
	t.Run("least request", func(t *testing.T) {
		pc.Policy = PolicyLeastRequest
		p, _ := NewPool(pc)
		bs := p.Backends()
		for i := 0; i < 5; i++ {
			defer begin(bs[0])()
			defer begin(bs[1])()
		}
		for i := 0; i < 50; i++ {
			if b, _ := p.pick([]*Backend{bs[2]}); b != bs[1] { // 5/2 beats 5/1
				t.Fatalf("picked %s; want b (weight 2, same in-flight)", b.URL.Host)
			}
		}
	})
	if _, err := NewSelector("fastest"); err == nil {
		t.Fatal("unknown policy accepted")
	}
}

func join(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += " "
		}
		out += x
	}
	return out
}

func TestPickHonoursCapAndTried(t *testing.T) {
	pc := quiet("http://a:1", "http://b:1")
	pc.Backends[0].MaxConcurrency = 1
	p, _ := NewPool(pc)
	a, b := p.Backends()[0], p.Backends()[1]
	defer begin(a)()
	for i := 0; i < 20; i++ {
		if got, _ := p.pick(nil); got != b {
			t.Fatal("picked a backend at its max_concurrency")
		}
	}
	if _, err := p.pick([]*Backend{b}); !errors.Is(err, ErrNoHealthyBackend) || RetryAfter(err) != 0 {
		t.Fatalf("all at cap or tried: %v (retry after %v); want ErrNoHealthyBackend without a retry delay", err, RetryAfter(err))
	}
}

func TestPassiveEjectionBackoffAndRecovery(t *testing.T) {
	pc := quiet("http://a:1", "http://b:1")
	pc.EjectAfter, pc.EjectFor = 2, 300*time.Millisecond
	p, _ := NewPool(pc)
	a, b := p.Backends()[0], p.Backends()[1]
	now := time.Now()
	a.report(false, now)
	if !a.Healthy(now) {
		t.Fatal("ejected after one failure; want eject_after 2")
	}
	a.report(false, now)
	if a.Healthy(now) || !a.Healthy(now.Add(300*time.Millisecond)) {
		t.Fatal("first ejection: want out for eject_for")
	}
	later := now.Add(400 * time.Millisecond)
	a.report(false, later)
	a.report(false, later)
	if a.Healthy(later.Add(500*time.Millisecond)) || !a.Healthy(later.Add(600*time.Millisecond)) {
		t.Fatal("second consecutive ejection: want twice as long")
	}
	a.report(true, later.Add(time.Second))
	if a.ejections.Load() != 0 {
		t.Fatal("a success did not reset the backoff")
	}
	b.report(false, now)
	b.report(false, now)
	_, err := p.pick(nil)
	if !errors.Is(err, ErrNoHealthyBackend) || RetryAfter(err) < time.Second {
		t.Fatalf("all ejected: %v, retry after %v; want ErrNoHealthyBackend with Retry-After ≥ 1s", err, RetryAfter(err))
	}
	if a.passiveEjections.Load() != 2 {
		t.Fatalf("counted %d ejections of a; want 2", a.passiveEjections.Load())
	}
}

// A backend that stops answering its health probes leaves rotation, and
// comes back when it answers again.
func TestProbeEjectsAndReadmits(t *testing.T) {
	g1, g2 := startGauged(t), startGauged(t)
	cfg := PoolConfig{Name: "p", Dialect: DialectNone,
		Health:   HealthConfig{Interval: 30 * time.Millisecond, Timeout: 20 * time.Millisecond, FailAfter: 2},
		Backends: []BackendConfig{{URL: g1.srv.URL}, {URL: g2.srv.URL}}}
	p := startPool(t, cfg)
	bad := p.Backends()[0]
	g1.set(func(g *gauged) { g.hang = true })
	waitFor(t, 5*time.Second, "the hung backend to be taken out", func() bool { return !bad.Healthy(time.Now()) })
	for i := 0; i < 20; i++ {
		if b, _ := p.pick(nil); b == bad {
			t.Fatal("picked a backend that fails its probes")
		}
	}
	g1.set(func(g *gauged) { g.hang = false })
	waitFor(t, 5*time.Second, "the backend to be readmitted", func() bool { return bad.Healthy(time.Now()) })
	if bad.probeEjections.Load() != 1 || bad.probeFailures.Load() < 2 {
		t.Fatalf("probe ejections %d, failures %d; want 1 and ≥ 2", bad.probeEjections.Load(), bad.probeFailures.Load())
	}
}

// Close stops every scraper and probe goroutine.
func TestStartCloseExits(t *testing.T) {
	g := startGauged(t)
	before := runtime.NumGoroutine()
	cfg := PoolConfig{Name: "p", ScrapeInterval: 10 * time.Millisecond,
		Health:   HealthConfig{Interval: 10 * time.Millisecond, Timeout: 10 * time.Millisecond},
		Backends: []BackendConfig{{URL: g.srv.URL}, {URL: g.srv.URL + "/"}}}
	p, err := NewPool(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p.Start(t.Context())
	p.Start(t.Context()) // a second Start does nothing
	waitFor(t, 3*time.Second, "samples", func() bool { return p.Backends()[1].Load(time.Now()).Known })
	p.Close()
	p.Close()
	waitFor(t, 3*time.Second, "goroutines to exit", func() bool { return runtime.NumGoroutine() <= before })
}
