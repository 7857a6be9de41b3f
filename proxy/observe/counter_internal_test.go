package observe

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/protobuf/proto"
)

// counterPair builds a client_golang CounterVec and a shardCounterVec with
// the same name, help and labels, each in a registry of its own.
func counterPair(shards int) (*prometheus.CounterVec, *shardCounterVec, *prometheus.Registry, *prometheus.Registry) {
	labels := []string{"route", "tenant", "code"}
	ref := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "Counted things."}, labels)
	own := newShardCounterVec("c_total", "Counted things.", labels, shards)
	r1, r2 := prometheus.NewRegistry(), prometheus.NewRegistry()
	r1.MustRegister(ref)
	r2.MustRegister(own)
	return ref, own, r1, r2
}

// counterValues returns n additions of kind: small integers (0 included),
// large integers (to 2^63 and past 2^64, where uint64(v) is not v),
// fractions, or special values (0, −0, +Inf, NaN, MaxFloat64, subnormals,
// 2^53 ± 1, 2^64, values just below integers).
func counterValues(rng *rand.Rand, kind string, n int) []float64 {
	specials := []float64{0, math.Copysign(0, -1), math.Inf(1), math.NaN(), math.MaxFloat64, 5e-324, 1e-300,
		1 << 53, 1<<53 + 2, 1 << 63, 1 << 64, 1.8446744073709552e19, math.Nextafter(1, 0), math.Nextafter(1<<64, 0),
		math.Nextafter(1<<64, math.Inf(1)), 0.5, 1, 1e300}
	out := make([]float64, 0, n)
	for len(out) < n {
		switch kind {
		case "small":
			out = append(out, float64(rng.IntN(5)))
		case "large":
			out = append(out, math.Floor(math.Exp(rng.Float64()*math.Log(1e20))))
		case "fraction":
			out = append(out, rng.Float64()*math.Pow(10, float64(rng.IntN(12)-4)))
		case "special":
			out = append(out, specials[rng.IntN(len(specials))])
		}
	}
	return out
}

// counterLabels are label sets, some sharing values, one not ASCII.
var counterLabels = [][3]string{{"chat", "t1", "200"}, {"chat", "t2", "200"}, {"chat", "t1", "502"},
	{"-", "-", "401"}, {"embed", "tenant-ü", "200"}, {"", "", ""}}

// gatherCounters compares both registries' families: protobuf equal (the
// created timestamp aside, which each side takes from its own clock; ours
// must have one) and text exposition byte for byte.
func gatherCounters(t *testing.T, what string, r1, r2 *prometheus.Registry) {
	t.Helper()
	ref, own := gatherPair(t, what, r1, r2)
	for i := range ref {
		a, b := proto.Clone(ref[i]).(*dto.MetricFamily), proto.Clone(own[i]).(*dto.MetricFamily)
		for _, m := range a.GetMetric() {
			if m.GetCounter() != nil {
				m.GetCounter().CreatedTimestamp = nil
			}
		}
		for _, m := range b.GetMetric() {
			if m.GetCounter() != nil {
				if m.GetCounter().GetCreatedTimestamp() == nil {
					t.Fatalf("%s: no created timestamp", what)
				}
				m.GetCounter().CreatedTimestamp = nil
			}
		}
		if !proto.Equal(a, b) {
			t.Fatalf("%s: protobuf differs:\nclient_golang %v\nown           %v", what, a, b)
		}
		var ta, tb bytes.Buffer
		if _, err := expfmt.MetricFamilyToText(&ta, ref[i]); err != nil {
			t.Fatal(err)
		}
		if _, err := expfmt.MetricFamilyToText(&tb, own[i]); err != nil {
			t.Fatal(err)
		}
		if ta.String() != tb.String() {
			t.Fatalf("%s: text differs:\nclient_golang %s\nown           %s", what, ta.String(), tb.String())
		}
	}
}

// The own counter's exposition is client_golang's for the same additions:
// random streams of small integers (0 included), large integers (past
// 2^64), fractions and special values (NaN, +Inf, −0, subnormals,
// MaxFloat64), through Add and Inc, into random label sets, gathered after
// every chunk and compared protobuf and text, with one shard and with
// four; the exact-integer part is also spread over the four shards
// directly. A series with NaN or +Inf stays so on both sides.
func TestShardCounterMatchesClientGolang(t *testing.T) {
	for _, mix := range [][]string{{"small"}, {"small", "large"}, {"small", "fraction"},
		{"small", "large", "fraction", "special"}} {
		for _, shards := range []int{1, 4} {
			t.Run(fmt.Sprintf("%v/shards%d", mix, shards), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(len(mix)), uint64(shards)))
				ref, own, r1, r2 := counterPair(shards)
				gatherCounters(t, "empty", r1, r2)
				for chunk := range 40 {
					kind := mix[rng.IntN(len(mix))]
					for _, v := range counterValues(rng, kind, 1+rng.IntN(200)) {
						l := counterLabels[rng.IntN(len(counterLabels))]
						a, b := ref.WithLabelValues(l[:]...), own.WithLabelValues(l[:]...)
						switch {
						case v == 1 && rng.IntN(2) == 0:
							a.Inc()
							b.Inc()
						case v == math.Trunc(v) && v < 1<<60 && rng.IntN(3) == 0:
							// The same integer split over the shards.
							a.Add(v)
							n := uint64(v)
							for i := range b.shards {
								part := n / uint64(len(b.shards)-i)
								b.shards[i].n += part
								n -= part
							}
						default:
							a.Add(v)
							b.Add(v)
						}
					}
					gatherCounters(t, fmt.Sprintf("chunk %d (%s)", chunk, kind), r1, r2)
				}
			})
		}
	}
}

// A negative addition panics as client_golang's does, with its message,
// and adds nothing; a wrong label count or invalid UTF-8 panics too.
func TestShardCounterPanics(t *testing.T) {
	ref, own, r1, r2 := counterPair(2)
	caught := func(f func()) (v any) {
		defer func() { v = recover() }()
		f()
		return nil
	}
	for _, v := range []float64{-1, -0.5, math.Inf(-1), -math.SmallestNonzeroFloat64} {
		a := caught(func() { ref.WithLabelValues("r", "t", "200").Add(v) })
		b := caught(func() { own.WithLabelValues("r", "t", "200").Add(v) })
		if a == nil || b == nil || fmt.Sprint(a) != fmt.Sprint(b) {
			t.Errorf("Add(%v): panic %v; client_golang's %v", v, b, a)
		}
	}
	gatherCounters(t, "after the panics", r1, r2)
	if caught(func() { own.WithLabelValues("r") }) == nil {
		t.Error("a wrong label count did not panic")
	}
	if caught(func() { own.WithLabelValues("r", "t", "\xff") }) == nil {
		t.Error("invalid UTF-8 did not panic")
	}
}

// Additions from many goroutines at once (so from several Ps and shards)
// add up to client_golang's fed the same additions in sequence: integers,
// and fractions that are exact in any order (multiples of 1/4 below 2^40).
// Scrapes run between. Run with -race.
func TestShardCounterConcurrent(t *testing.T) {
	ref, own, r1, r2 := counterPair(4)
	const workers, per = 8, 2000
	var wg sync.WaitGroup
	vals := make([][]float64, workers)
	for w := range workers {
		rng := rand.New(rand.NewPCG(uint64(w), 9))
		for range per {
			v := float64(rng.IntN(1000))
			if rng.IntN(4) == 0 {
				v = float64(rng.IntN(1<<20)) / 4
			}
			vals[w] = append(vals[w], v)
		}
	}
	stop := make(chan struct{})
	scraped := make(chan struct{})
	go func() { // the scraper: owned here, ends when stop closes
		defer close(scraped)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := r2.Gather(); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	for w := range workers {
		wg.Go(func() {
			for i, v := range vals[w] {
				c := own.WithLabelValues(counterLabels[(w+i)%3][:]...)
				if v == 1 {
					c.Inc()
				} else {
					c.Add(v)
				}
				if i%100 == 0 {
					runtime.Gosched()
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-scraped
	for w := range workers {
		for i, v := range vals[w] {
			ref.WithLabelValues(counterLabels[(w+i)%3][:]...).Add(v)
		}
	}
	gatherCounters(t, "after the goroutines", r1, r2)
}

// Requests of alternating kinds recorded from one goroutine (so through
// one P's last-series slot, which each kind then replaces) land in their
// own series: a key differing from the slot's in any one field is not
// taken for it.
func TestLastSeriesSlot(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, 10)
	base := reqSeriesKey{route: "chat", proto: "h1", tenant: "t1", pool: "p", backend: "10.0.0.1:80",
		path: "/chat/completions", model: "m", code: 200}
	keys := []reqSeriesKey{base}
	for i := range 9 {
		k := base
		switch i {
		case 0:
			k.route = "chat2"
		case 1:
			k.proto = "h2"
		case 2:
			k.tenant = "t2"
		case 3:
			k.pool = "q"
		case 4:
			k.backend = "10.0.0.2:80"
		case 5:
			k.path = "/messages"
		case 6:
			k.model = "m2"
		case 7:
			k.errType = "upstream_error"
		case 8:
			k.code = 502
		}
		keys = append(keys, k)
	}
	for round := range 3 {
		for i, k := range keys {
			if s := m.series(k); s.k != k {
				t.Fatalf("round %d key %d: series of %+v; want %+v", round, i, s.k, k)
			}
			if s := m.series(k); s.k != k { // the slot's, now
				t.Fatalf("round %d key %d again: series of %+v", round, i, s.k)
			}
		}
	}
}

// BenchmarkCounter measures one Inc and one Add of an integer (what a
// request does to sluice_requests_total and sluice_tokens_total),
// client_golang's counter against the own one, from one goroutine
// ("serial") and from GOMAXPROCS goroutines into the same series
// ("parallel", the cross-core case), and "spaced" between other work.
//
//	go test -run '^$' -bench BenchmarkCounter -cpu 1,2 -benchmem ./proxy/observe/
func BenchmarkCounter(b *testing.B) {
	ref, own, _, _ := counterPair(0)
	for _, side := range []struct {
		name string
		c    interface {
			Inc()
			Add(float64)
		}
	}{{"client_golang", ref.WithLabelValues("r", "t", "200")}, {"own", own.WithLabelValues("r", "t", "200")}} {
		b.Run(side.name+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				side.c.Inc()
				side.c.Add(17)
			}
		})
		b.Run(side.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					side.c.Inc()
					side.c.Add(17)
				}
			})
		})
		// spaced: as a request does, other work between the updates
		// (here writing 16 KiB of the goroutine's own memory, which the
		// other core's updates meanwhile take the shared line away from).
		b.Run(side.name+"/spaced", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				buf := make([]uint64, 2048)
				for pb.Next() {
					side.c.Inc()
					side.c.Add(17)
					for i := range buf {
						buf[i]++
					}
				}
			})
		})
	}
}

// BenchmarkSeriesLookup measures finding a request's series: "one" kind
// of request (target 3's load: one route, tenant, backend and model), or
// "four" kinds in turn (each replacing the P's last-series slot, so each
// a byReq lookup), and byReq's lookup alone (the code before the slot).
//
//	go test -run '^$' -bench BenchmarkSeriesLookup -cpu 1,2 -benchmem ./proxy/observe/
func BenchmarkSeriesLookup(b *testing.B) {
	m := NewMetrics(nil, 10)
	var keys []reqSeriesKey
	for i := range 4 {
		keys = append(keys, reqSeriesKey{route: "chat", proto: "HTTP/1.1", tenant: fmt.Sprintf("tenant-%d", i), pool: "default",
			backend: "127.0.0.1:8000", path: "/chat/completions", model: "llama-3-8b", code: 200})
		m.series(keys[i])
	}
	b.Run("byReq/serial", func(b *testing.B) { // without the slot, as before
		b.ReportAllocs()
		for b.Loop() {
			m.lookupSeries(keys[0])
		}
	})
	b.Run("byReq/parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				m.lookupSeries(keys[0])
			}
		})
	})
	for _, n := range []int{1, 4} {
		name := map[int]string{1: "one", 4: "four"}[n]
		b.Run(name+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				m.series(keys[i%n])
				i++
			}
		})
		b.Run(name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					m.series(keys[i%n])
					i++
				}
			})
		})
	}
}
