package observe

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/protobuf/proto"
)

// histConfig is one histogram configuration, built both ways.
type histConfig struct {
	name       string
	buckets    []float64
	factor     float64
	maxBuckets uint32
	minReset   time.Duration
}

// sluiceHistConfigs are the configurations NewMetrics uses, and corners
// of the bucket limit: halving down to schema -4 without a reset, the
// immediate reset once the last one is older than the minimum duration,
// a limit so low that one halving is not enough, and classic buckets only.
func sluiceHistConfigs() []histConfig {
	return []histConfig{
		{"latency", latencyBuckets, nativeFactor, nativeMaxBuckets, nativeMinReset},
		{"itl", itlBuckets, nativeFactor, nativeMaxBuckets, nativeMinReset},
		{"otel_ttft", otelTTFTBuckets, nativeFactor, nativeMaxBuckets, nativeMinReset},
		{"otel_tpot", otelTPOTBuckets, nativeFactor, nativeMaxBuckets, nativeMinReset},
		{"otel_duration", otelDurationBuckets, nativeFactor, nativeMaxBuckets, nativeMinReset},
		{"classic_latency", latencyBuckets, 0, 0, 0},
		{"classic_tokens", otelTokenBuckets, 0, 0, 0},
		{"default_buckets", nil, 0, 0, 0},
		{"native_only", nil, nativeFactor, nativeMaxBuckets, 0},
		{"halve_no_reset", latencyBuckets, nativeFactor, 20, 0},
		{"reset_at_once", latencyBuckets, nativeFactor, 20, time.Nanosecond},
		{"tiny_limit", []float64{1}, nativeFactor, 1, 0},
		{"schema0", latencyBuckets, 2, 10, 0},
		{"many_classic", prometheus.ExponentialBuckets(1e-6, 1.2, 60), nativeFactor, nativeMaxBuckets, 0},
	}
}

// pair builds c as a client_golang HistogramVec and as a shardHistVec,
// each in a registry of its own.
func (c histConfig) pair(shards int) (*prometheus.HistogramVec, *shardHistVec, *prometheus.Registry, *prometheus.Registry) {
	name := "h_" + c.name
	labels := []string{"route", "stage"}
	ref := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: "help " + c.name, Buckets: c.buckets,
		NativeHistogramBucketFactor: c.factor, NativeHistogramMaxBucketNumber: c.maxBuckets,
		NativeHistogramMinResetDuration: c.minReset}, labels)
	own := newShardHistVec(histOpts{name: name, help: "help " + c.name, labels: labels, buckets: c.buckets,
		factor: c.factor, maxBuckets: c.maxBuckets, minReset: c.minReset, shards: shards})
	r1, r2 := prometheus.NewRegistry(), prometheus.NewRegistry()
	r1.MustRegister(ref)
	r2.MustRegister(own)
	return ref, own, r1, r2
}

// histValues returns n values of kind: latencies log-uniform from 1 µs to
// 10 min, spread values from 1e-12 to 1e6, or the special ones (zero, the
// zero threshold and values about it, subnormals, negatives, NaN, ±Inf,
// MaxFloat64, powers of two and bucket bounds exactly).
func histValues(rng *rand.Rand, kind string, n int) []float64 {
	out := make([]float64, 0, n)
	logUniform := func(lo, hi float64) float64 {
		return math.Exp(math.Log(lo) + rng.Float64()*(math.Log(hi)-math.Log(lo)))
	}
	specials := []float64{0, math.Copysign(0, -1), nativeZeroThreshold, math.Nextafter(nativeZeroThreshold, 1),
		math.Nextafter(nativeZeroThreshold, 0), -nativeZeroThreshold, 5e-324, -5e-324, 1e-40, -1e-300,
		math.NaN(), math.Inf(1), math.Inf(-1), math.MaxFloat64, -math.MaxFloat64, 1, 0.5, 2, 0.25, 1024,
		-1, -0.003, 0.0005, 0.001, 120, 1e300, -1e300}
	for _, f := range schema3Bounds[:8] {
		specials = append(specials, f, f*2, f/1024, math.Nextafter(f, 0), math.Nextafter(f, 2))
	}
	for _, b := range latencyBuckets {
		specials = append(specials, b, math.Nextafter(b, 0), math.Nextafter(b, 1e9))
	}
	for len(out) < n {
		switch kind {
		case "latency":
			out = append(out, logUniform(1e-6, 600))
		case "spread":
			out = append(out, logUniform(1e-12, 1e6))
		case "narrow": // a stage of a few µs: few buckets
			out = append(out, logUniform(2e-6, 9e-6))
		case "special":
			out = append(out, specials[rng.IntN(len(specials))])
		case "itl": // microseconds as the ITL path converts them
			out = append(out, float64(uint32(logUniform(1, 5e6)))/1e6)
		}
	}
	return out
}

// gatherPair gathers both registries: the same number of families, or
// the test fails.
func gatherPair(t *testing.T, what string, r1, r2 *prometheus.Registry) (ref, own []*dto.MetricFamily) {
	t.Helper()
	ref, err := r1.Gather()
	if err != nil {
		t.Fatal(err)
	}
	own, err = r2.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(ref) != len(own) {
		t.Fatalf("%s: %d families; want %d", what, len(own), len(ref))
	}
	return ref, own
}

// gatherBoth gathers both registries and compares them: every family's
// protobuf exactly (the created timestamp aside: each histogram keeps
// its own clock) and its text exposition byte for byte.
func gatherBoth(t *testing.T, what string, r1, r2 *prometheus.Registry, sumTolerance float64) {
	t.Helper()
	ref, own := gatherPair(t, what, r1, r2)
	for i := range ref {
		for _, m := range own[i].GetMetric() {
			if m.GetHistogram().GetCreatedTimestamp() == nil {
				t.Fatalf("%s: no created timestamp", what)
			}
		}
		a, b := stripCreated(ref[i]), stripCreated(own[i])
		if sumTolerance > 0 {
			alignSums(a, b, sumTolerance, t)
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
		if sumTolerance == 0 && ta.String() != tb.String() {
			t.Fatalf("%s: text differs:\nclient_golang %s\nown           %s", what, ta.String(), tb.String())
		}
	}
}

func stripCreated(mf *dto.MetricFamily) *dto.MetricFamily {
	mf = proto.Clone(mf).(*dto.MetricFamily)
	for _, m := range mf.GetMetric() {
		if h := m.GetHistogram(); h != nil {
			h.CreatedTimestamp = nil
		}
	}
	return mf
}

// alignSums checks b's sums against a's within a relative tolerance and
// then sets them equal.
func alignSums(a, b *dto.MetricFamily, tol float64, t *testing.T) {
	t.Helper()
	for i, m := range a.GetMetric() {
		if i >= len(b.GetMetric()) {
			return
		}
		x, y := m.GetHistogram().GetSampleSum(), b.GetMetric()[i].GetHistogram().GetSampleSum()
		if !(x == y || math.IsNaN(x) && math.IsNaN(y) || math.Abs(x-y) <= tol*math.Abs(x)) {
			t.Fatalf("sum %v; want %v (± %g relative)", y, x, tol)
		}
		b.GetMetric()[i].GetHistogram().SampleSum = proto.Float64(x)
	}
}

// The own histogram's exposition is client_golang's for the same
// observations: each configuration Sluice uses and the bucket limit's
// corners, fed the same random streams (latencies, spread values, special
// values, ITL microseconds), gathered after every chunk (a gather swaps
// client_golang's hot and cold counts) and compared protobuf and text.
func TestShardHistMatchesClientGolang(t *testing.T) {
	kinds := []string{"latency", "spread", "narrow", "special", "itl"}
	for _, c := range sluiceHistConfigs() {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(len(c.name)), 9))
			ref, own, r1, r2 := c.pair(1)
			for chunk := range 40 {
				kind := kinds[rng.IntN(len(kinds))]
				series := []string{"r", fmt.Sprint(chunk % 3)}
				vs := histValues(rng, kind, 1+rng.IntN(300))
				if kind == "itl" {
					us := make([]uint32, len(vs))
					for i, v := range vs {
						us[i] = uint32(math.Round(v * 1e6))
						ref.WithLabelValues(series...).Observe(float64(us[i]) / 1e6)
					}
					own.WithLabelValues(series...).observeMicros(us)
				} else {
					for _, v := range vs {
						ref.WithLabelValues(series...).Observe(v)
						own.WithLabelValues(series...).Observe(v)
					}
				}
				gatherBoth(t, fmt.Sprintf("chunk %d (%s, %d values)", chunk, kind, len(vs)), r1, r2, 0)
			}
		})
	}
}

// The reset scheduled when the bucket limit is first exceeded (the last
// reset less than the minimum duration ago) empties the histogram when
// the duration has passed, as client_golang's timer does. Both
// histograms run on the real clock (client_golang's cannot be given
// another), so the minimum reset duration must outlast the 1,000
// observations and the first scrape on a loaded machine: 1.5 s (they took
// up to 161 ms with -race in a 0.4-CPU cgroup; at 300 ms the histograms
// could reset before the scrape meant to see them full).
func TestShardHistScheduledReset(t *testing.T) {
	c := histConfig{"scheduled", latencyBuckets, nativeFactor, 10, 1500 * time.Millisecond}
	ref, own, r1, r2 := c.pair(1)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, v := range histValues(rng, "latency", 500) {
		ref.WithLabelValues("r", "s").Observe(v)
		own.WithLabelValues("r", "s").Observe(v)
	}
	gatherBoth(t, "before the reset", r1, r2, 0)
	fams, _ := r2.Gather()
	if s := fams[0].GetMetric()[0].GetHistogram().GetSchema(); s >= 3 {
		t.Fatalf("schema %d after 500 spread values with a limit of 10; want it lowered", s)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		a, _ := r1.Gather()
		b, _ := r2.Gather()
		if a[0].GetMetric()[0].GetHistogram().GetSampleCount() == 0 && b[0].GetMetric()[0].GetHistogram().GetSampleCount() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not reset within 10 s: counts %d and %d", a[0].GetMetric()[0].GetHistogram().GetSampleCount(),
				b[0].GetMetric()[0].GetHistogram().GetSampleCount())
		}
		time.Sleep(20 * time.Millisecond)
	}
	gatherBoth(t, "after the reset", r1, r2, 0)
	for _, v := range histValues(rng, "narrow", 50) {
		ref.WithLabelValues("r", "s").Observe(v)
		own.WithLabelValues("r", "s").Observe(v)
	}
	gatherBoth(t, "after the reset, observed again", r1, r2, 0)
}

// Sharded and observed from many goroutines at once (with scrapes
// between), the result is client_golang's for the same values observed
// one after the other: the counts exactly, the schema too (without a
// minimum reset duration the final schema does not depend on the order),
// the sum within rounding. Run with -race.
func TestShardHistConcurrent(t *testing.T) {
	for _, c := range []histConfig{
		{"sharded", latencyBuckets, nativeFactor, nativeMaxBuckets, 0},
		{"sharded_halving", latencyBuckets, nativeFactor, 30, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			ref, own, r1, r2 := c.pair(4)
			var (
				wg  sync.WaitGroup
				mu  sync.Mutex
				all []float64
			)
			for g := range 8 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(g), 3))
					vs := histValues(rng, []string{"latency", "spread", "itl"}[g%3], 2000)
					for i, v := range vs {
						own.WithLabelValues("r", "s").Observe(v)
						if i%500 == 0 {
							if _, err := r2.Gather(); err != nil {
								t.Error(err)
							}
						}
					}
					mu.Lock()
					all = append(all, vs...)
					mu.Unlock()
				})
			}
			wg.Wait()
			for _, v := range all {
				ref.WithLabelValues("r", "s").Observe(v)
			}
			gatherBoth(t, "after concurrent observations", r1, r2, 1e-9)
		})
	}
}

// nativeKey is client_golang's bucket index (sort.SearchFloat64s over its
// schema-3 bounds, then the lower schemas' own computation).
func TestNativeKey(t *testing.T) {
	ref := func(v float64, schema int32) int {
		inf := math.IsInf(v, 0)
		if inf {
			v = math.MaxFloat64
		}
		frac, exp := math.Frexp(math.Abs(v))
		var key int
		if schema > 0 {
			b := schema3Bounds[:8]
			if schema < 3 {
				var bb []float64
				for i := 0; i < 8; i += 1 << (3 - schema) {
					bb = append(bb, b[i])
				}
				b = bb
			}
			key = sort.SearchFloat64s(b, frac) + (exp-1)*len(b)
		} else {
			key = exp
			if frac == 0.5 {
				key--
			}
			key = (key + (1 << -schema) - 1) >> -schema
		}
		if inf {
			key++
		}
		return key
	}
	rng := rand.New(rand.NewPCG(5, 5))
	vs := append(histValues(rng, "special", 2000), histValues(rng, "spread", 2000)...)
	for _, v := range vs {
		if math.IsNaN(v) || v == 0 {
			continue
		}
		for s := int32(3); s >= -4; s-- {
			if got, want := nativeKey(v, s), ref(v, s); got != want {
				t.Fatalf("nativeKey(%v, %d) = %d; want %d", v, s, got, want)
			}
		}
	}
}

// BenchmarkHistObserve measures one observation of a latency series as
// Sluice configures it (classic and native buckets), client_golang's
// HistogramVec's and the own one's, each from one goroutine ("serial")
// and from GOMAXPROCS goroutines into the same series ("parallel", the
// cross-core case). Values cycle through 1,024 latencies from 10 µs to
// 1 s, already observed once (the buckets exist).
//
//	go test -run '^$' -bench BenchmarkHistObserve -cpu 1,2 -benchmem ./proxy/observe/
func BenchmarkHistObserve(b *testing.B) {
	c := histConfig{"bench", latencyBuckets, nativeFactor, nativeMaxBuckets, nativeMinReset}
	ref, own, _, _ := c.pair(0)
	vs := histValues(rand.New(rand.NewPCG(7, 7)), "narrow", 0)
	rng := rand.New(rand.NewPCG(7, 7))
	for range 1024 {
		vs = append(vs, math.Exp(math.Log(1e-5)+rng.Float64()*(math.Log(1)-math.Log(1e-5))))
	}
	for _, side := range []struct {
		name string
		o    prometheus.Observer
	}{{"client_golang", ref.WithLabelValues("r", "s")}, {"own", own.WithLabelValues("r", "s")}} {
		for _, v := range vs {
			side.o.Observe(v)
		}
		b.Run(side.name+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				side.o.Observe(vs[i&1023])
				i++
			}
		})
		b.Run(side.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := rand.IntN(1024)
				for pb.Next() {
					side.o.Observe(vs[i&1023])
					i++
				}
			})
		})
	}
}

// BenchmarkHistITL measures a stream's 256 inter-token gaps observed at
// its end: client_golang's Observe per gap against observeMicros.
//
//	go test -run '^$' -bench BenchmarkHistITL -benchmem ./proxy/observe/
func BenchmarkHistITL(b *testing.B) {
	c := histConfig{"itl", itlBuckets, nativeFactor, nativeMaxBuckets, nativeMinReset}
	ref, own, _, _ := c.pair(0)
	rng := rand.New(rand.NewPCG(8, 8))
	us := make([]uint32, 256)
	for i := range us {
		us[i] = uint32(15000 + rng.IntN(10000))
	}
	r, o := ref.WithLabelValues("r", "s"), own.WithLabelValues("r", "s")
	b.Run("client_golang", func(b *testing.B) {
		for b.Loop() {
			for _, u := range us {
				r.Observe(float64(u) / 1e6)
			}
		}
	})
	b.Run("own", func(b *testing.B) {
		for b.Loop() {
			o.observeMicros(us)
		}
	})
}
