package observe

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// shardHistVec is a histogram vector with classic and, optionally, native
// (sparse, exponential) buckets whose exposition is what client_golang's
// HistogramVec gives for the same observations and options (the version
// in go.mod: schema from the bucket factor, the default zero threshold,
// spans and deltas, the bucket limit's resolution halving and the reset
// after the minimum reset duration). What differs is how an observation is
// counted: in one of a few shards, chosen by the P the goroutine runs on,
// under that shard's uncontended lock, with native buckets in a dense array
// instead of client_golang's sync.Map per bucket. A scrape merges the
// shards. Sharded, the sum is the shards' sums added, so it can differ from
// client_golang's (one running sum in observation order) in the last bits.
//
// Not supported (not used by Sluice): exemplars, a bucket factor finer than
// schema 3, a zero threshold other than the default and its widening
// (NativeHistogramMaxZeroThreshold), const labels.
type shardHistVec struct {
	seriesSet[*shardHist]
	names []string
	o     histOpts
}

// histOpts configure a shardHistVec like prometheus.HistogramOpts.
type histOpts struct {
	name, help string
	labels     []string
	buckets    []float64
	// factor > 1 adds native buckets (client_golang's
	// NativeHistogramBucketFactor); at most 2^(2^-3) apart, schema 3.
	factor     float64
	maxBuckets uint32        // NativeHistogramMaxBucketNumber; 0: no limit
	minReset   time.Duration // NativeHistogramMinResetDuration; 0: never reset

	shards    int // 0: GOMAXPROCS, at most maxShards
	now       func() time.Time
	afterFunc func(time.Duration, func()) *time.Timer
}

// maxShards bounds a histogram's shards: each holds its own buckets.
const maxShards = 16

func newShardHistVec(o histOpts) *shardHistVec {
	if len(o.buckets) == 0 && o.factor <= 1 {
		o.buckets = prometheus.DefBuckets
	}
	for i, b := range o.buckets {
		if i < len(o.buckets)-1 && b >= o.buckets[i+1] {
			panic(fmt.Errorf("histogram buckets must be in increasing order: %f >= %f", b, o.buckets[i+1]))
		}
		if i == len(o.buckets)-1 && math.IsInf(b, +1) {
			o.buckets = o.buckets[:i]
		}
	}
	if o.factor > 1 && pickSchema(o.factor) > 3 {
		panic(fmt.Errorf("native bucket factor %v: schema above 3 not supported", o.factor))
	}
	if o.shards <= 0 {
		o.shards = min(runtime.GOMAXPROCS(0), maxShards)
	}
	if o.now == nil {
		o.now = time.Now
	}
	if o.afterFunc == nil {
		o.afterFunc = time.AfterFunc
	}
	v := &shardHistVec{names: o.labels, o: o}
	v.seriesSet = newSeriesSet(o.name, o.help, o.labels, v.newHist)
	return v
}

// newHist makes the histogram of the label values lvs.
func (v *shardHistVec) newHist(lvs []string) *shardHist { return newShardHist(v.desc, v.o, lvs) }

// With is WithLabelValues by label name.
func (v *shardHistVec) With(l prometheus.Labels) *shardHist {
	if len(l) != v.labels {
		panic(fmt.Errorf("%s: expected %d labels but got %d", v.o.name, v.labels, len(l)))
	}
	lvs := make([]string, len(v.names))
	for i, n := range v.names {
		val, ok := l[n]
		if !ok {
			panic(fmt.Errorf("%s: label name %q missing", v.o.name, n))
		}
		lvs[i] = val
	}
	return v.WithLabelValues(lvs...)
}

// shardHist is one series of a shardHistVec. Safe for simultaneous use by multiple
// goroutines.
type shardHist struct {
	desc   *prometheus.Desc
	labels []*dto.LabelPair
	upper  []float64
	native bool
	schema int32 // initial native schema

	shards []histShard
	// over is set while the native buckets exceed maxBuckets: every
	// observation then takes the slow path (client_golang checks the
	// limit after each one).
	over atomic.Bool

	mu         sync.Mutex // serializes the slow path and scrapes; taken before shard locks
	maxBuckets uint32
	minReset   time.Duration
	now        func() time.Time
	afterFunc  func(time.Duration, func()) *time.Timer
	gen        uint64 // bumped when the buckets are reset or halved (also in each shard)
	// The native buckets populated in any shard at the current schema,
	// and how many (client_golang's nativeHistogramBucketsNumber).
	pos, neg       map[int]struct{}
	nBuckets       uint32
	lastReset      time.Time
	resetScheduled bool
}

// histShard is one shard's counts, padded so that shards share no cache
// line.
type histShard struct {
	histCounts
	_ [(256 - unsafe.Sizeof(histCounts{})%256) % 256]byte
}

type histCounts struct {
	mu      sync.Mutex
	count   uint64
	sum     float64
	zero    uint64   // native zero bucket
	classic []uint64 // per classic bucket, not cumulative; +Inf is count
	pos     denseBuckets
	neg     denseBuckets
	schema  int32  // the histogram's current schema (set under all locks)
	gen     uint64 // the histogram's gen
}

func newShardHist(desc *prometheus.Desc, o histOpts, lvs []string) *shardHist {
	h := &shardHist{desc: desc, labels: prometheus.MakeLabelPairs(desc, lvs), upper: o.buckets,
		native: o.factor > 1, maxBuckets: o.maxBuckets, minReset: o.minReset, now: o.now, afterFunc: o.afterFunc,
		shards: make([]histShard, o.shards)}
	if h.native {
		h.schema = pickSchema(o.factor)
	}
	h.lastReset = h.now()
	// The classic counts of all shards in one array, each shard's 128
	// bytes away from the next's (and from the array's neighbours).
	stride := (len(h.upper) + 15) &^ 15
	all := make([]uint64, 16+stride*len(h.shards))
	for i := range h.shards {
		s := &h.shards[i]
		s.classic = all[16+i*stride : 16+i*stride+len(h.upper) : 16+i*stride+len(h.upper)]
		s.schema = h.schema
	}
	return h
}

//go:linkname procPin runtime.procPin
func procPin() int

//go:linkname procUnpin runtime.procUnpin
func procUnpin()

// shard returns the shard of the P the caller runs on.
func (h *shardHist) shard() *histCounts {
	if len(h.shards) == 1 {
		return &h.shards[0].histCounts
	}
	p := procPin()
	procUnpin()
	return &h.shards[uint(p)%uint(len(h.shards))].histCounts
}

// Observe implements prometheus.Observer.
func (h *shardHist) Observe(v float64) {
	s := h.shard()
	s.mu.Lock()
	neg, key, isNew := h.add(s, v)
	gen := s.gen
	s.mu.Unlock()
	if isNew || h.over.Load() {
		h.slow(v, neg, key, gen, isNew)
	}
}

// observeMicros observes each of us, in microseconds, as seconds (one
// inter-token gap each), taking the shard's lock once for the run.
func (h *shardHist) observeMicros(us []uint32) {
	for len(us) > 0 {
		s := h.shard()
		s.mu.Lock()
		var (
			v              float64
			neg, isNew     bool
			key, n         int
			gen            = s.gen
			slowAfterwards bool
		)
		for n < len(us) {
			v = float64(us[n]) / 1e6
			neg, key, isNew = h.add(s, v)
			n++
			if isNew || h.over.Load() {
				slowAfterwards = true
				break
			}
		}
		s.mu.Unlock()
		us = us[n:]
		if slowAfterwards {
			h.slow(v, neg, key, gen, isNew)
		}
	}
}

// add counts v in s (whose lock is held) and returns its native bucket's
// sign and key, and whether that native bucket is new in s.
func (h *shardHist) add(s *histCounts, v float64) (neg bool, key int, isNew bool) {
	b := h.findBucket(v)
	if b < len(s.classic) {
		s.classic[b]++
	}
	s.sum += v
	s.count++
	if !h.native || math.IsNaN(v) {
		return false, 0, false
	}
	switch {
	case v > nativeZeroThreshold:
		key = nativeKey(v, s.schema)
		isNew = s.pos.add(key, 1)
	case v < -nativeZeroThreshold:
		key, neg = nativeKey(v, s.schema), true
		isNew = s.neg.add(key, 1)
	default:
		s.zero++
	}
	return neg, key, isNew
}

// findBucket is client_golang's: the index of the first upper bound ≥ v;
// len(upper) for +Inf and NaN.
func (h *shardHist) findBucket(v float64) int {
	n := len(h.upper)
	if n == 0 || v <= h.upper[0] {
		return 0
	}
	if v > h.upper[n-1] {
		return n
	}
	lo, hi := 1, n-1 // upper[lo-1] < v <= upper[hi]
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if h.upper[m] >= v {
			hi = m
		} else {
			lo = m + 1
		}
	}
	if math.IsNaN(v) {
		return n
	}
	return lo
}

// nativeZeroThreshold is client_golang's DefNativeHistogramZeroThreshold
// (2^-128).
const nativeZeroThreshold = prometheus.DefNativeHistogramZeroThreshold

// schema3Bounds are the fractions of the bucket bounds at schema 3, as
// client_golang's table has them, and +Inf.
var schema3Bounds = [9]float64{0.5, 0.5452538663326288, 0.5946035575013605, 0.6484197773255048,
	0.7071067811865475, 0.7711054127039704, 0.8408964152537144, 0.9170040432046711, math.Inf(1)}

// nativeKey is v's native bucket index at schema (≤ 3): client_golang's
// computation at schema 3, then halved 3-schema times rounding up, which is
// its computation at the lower schema.
func nativeKey(v float64, schema int32) int {
	inf := math.IsInf(v, 0)
	if inf {
		v = math.MaxFloat64
	}
	frac, exp := math.Frexp(math.Abs(v))
	// sort.SearchFloat64s(bounds, frac): bounds below frac, in four
	// comparisons.
	i := 0
	if schema3Bounds[3] < frac {
		i = 4
	}
	if schema3Bounds[i+1] < frac {
		i += 2
	}
	if schema3Bounds[i] < frac {
		i++
	}
	if schema3Bounds[i] < frac {
		i++
	}
	key := i + (exp-1)*8
	if d := 3 - schema; d > 0 {
		key = (key + 1<<d - 1) >> d
	}
	if inf {
		key++
	}
	return key
}

// pickSchema is client_golang's schema for a bucket factor.
func pickSchema(factor float64) int32 {
	floor := math.Floor(math.Log2(math.Log2(factor)))
	switch {
	case floor <= -8:
		return 8
	case floor >= 4:
		return -4
	}
	return -int32(floor)
}

// slow registers a native bucket new in its shard and keeps the bucket
// limit, as client_golang's limitBuckets does after an observation.
func (h *shardHist) slow(v float64, neg bool, key int, gen uint64, isNew bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if isNew && gen == h.gen {
		set := h.pos
		if neg {
			set = h.neg
		}
		if set == nil {
			h.pos, h.neg = map[int]struct{}{}, map[int]struct{}{}
			set = h.pos
			if neg {
				set = h.neg
			}
		}
		if _, ok := set[key]; !ok {
			set[key] = struct{}{}
			h.nBuckets++
		}
	}
	if h.maxBuckets == 0 || h.nBuckets <= h.maxBuckets || math.IsNaN(v) {
		return
	}
	defer func() { h.over.Store(h.maxBuckets > 0 && h.nBuckets > h.maxBuckets) }()
	if h.maybeReset(v) {
		return
	}
	if h.minReset > 0 && !h.resetScheduled {
		h.resetScheduled = true
		h.afterFunc(h.minReset-h.now().Sub(h.lastReset), h.timedReset)
	}
	h.halve()
}

// maybeReset resets the histogram when the last reset is minReset ago and
// none is scheduled, keeping only the observation v (client_golang's
// maybeReset).
func (h *shardHist) maybeReset(v float64) bool {
	if h.minReset == 0 || h.resetScheduled || h.now().Sub(h.lastReset) < h.minReset {
		return false
	}
	h.lockShards()
	h.resetLocked()
	s := &h.shards[0].histCounts
	neg, key, isNew := h.add(s, v)
	if isNew {
		if neg {
			h.neg[key] = struct{}{}
		} else {
			h.pos[key] = struct{}{}
		}
		h.nBuckets = 1
	}
	h.unlockShards()
	h.lastReset = h.now()
	return true
}

// timedReset is the reset scheduled when the bucket limit was exceeded.
func (h *shardHist) timedReset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lockShards()
	h.resetLocked()
	h.unlockShards()
	h.lastReset = h.now()
	h.resetScheduled = false
	h.over.Store(false)
}

// resetLocked zeroes every count; h.mu and all shard locks are held.
func (h *shardHist) resetLocked() {
	h.gen++
	for i := range h.shards {
		s := &h.shards[i].histCounts
		s.count, s.sum, s.zero = 0, 0, 0
		clear(s.classic)
		s.pos.reset()
		s.neg.reset()
		s.schema, s.gen = h.schema, h.gen
	}
	h.pos, h.neg, h.nBuckets = map[int]struct{}{}, map[int]struct{}{}, 0
}

// halve halves the native buckets' resolution (client_golang's
// doubleBucketWidth), unless it is at schema -4 already.
func (h *shardHist) halve() {
	h.lockShards()
	defer h.unlockShards()
	schema := h.shards[0].schema
	if schema == -4 {
		return
	}
	h.gen++
	h.pos, h.neg = map[int]struct{}{}, map[int]struct{}{}
	for i := range h.shards {
		s := &h.shards[i].histCounts
		s.pos.halve()
		s.neg.halve()
		s.schema, s.gen = schema-1, h.gen
		s.pos.keys(h.pos)
		s.neg.keys(h.neg)
	}
	h.nBuckets = uint32(len(h.pos) + len(h.neg))
}

func (h *shardHist) lockShards() {
	for i := range h.shards {
		h.shards[i].mu.Lock()
	}
}

func (h *shardHist) unlockShards() {
	for i := range h.shards {
		h.shards[i].mu.Unlock()
	}
}

// Desc implements prometheus.Metric.
func (h *shardHist) Desc() *prometheus.Desc { return h.desc }

// Write implements prometheus.Metric: the shards merged, as client_golang
// writes its histogram.
func (h *shardHist) Write(out *dto.Metric) error {
	h.mu.Lock()
	var (
		count, zero uint64
		sum         float64
		classic     = make([]uint64, len(h.upper))
		pos, neg    denseBuckets
		schema      int32
	)
	for i := range h.shards {
		s := &h.shards[i].histCounts
		s.mu.Lock()
		count += s.count
		sum += s.sum
		zero += s.zero
		for j, c := range s.classic {
			classic[j] += c
		}
		pos.merge(&s.pos)
		neg.merge(&s.neg)
		schema = s.schema
		s.mu.Unlock()
	}
	created := h.lastReset
	h.mu.Unlock()

	his := &dto.Histogram{
		Bucket:           make([]*dto.Bucket, len(h.upper)),
		SampleCount:      &count,
		SampleSum:        &sum,
		CreatedTimestamp: timestamppb.New(created),
	}
	var cum uint64
	for i, ub := range h.upper {
		cum += classic[i]
		his.Bucket[i] = &dto.Bucket{CumulativeCount: new(cum), UpperBound: new(ub)}
	}
	if h.native {
		his.ZeroThreshold = new(nativeZeroThreshold)
		his.Schema = &schema
		his.ZeroCount = &zero
		his.NegativeSpan, his.NegativeDelta = neg.spans()
		his.PositiveSpan, his.PositiveDelta = pos.spans()
	}
	out.Histogram = his
	out.Label = h.labels
	return nil
}

// denseBuckets are native bucket counts by key, c[i] the count of key
// lo+i; grown to the keys seen, with room to spare at both ends (which
// also keeps counts in use a cache line away from neighbouring objects).
type denseBuckets struct {
	lo int
	c  []uint64
}

const denseSlack = 16

// add adds n to key's count and reports whether it was zero.
func (d *denseBuckets) add(key int, n uint64) bool {
	i := key - d.lo
	if uint(i) >= uint(len(d.c)) {
		d.grow(key)
		i = key - d.lo
	}
	d.c[i] += n
	return d.c[i] == n
}

func (d *denseBuckets) grow(key int) {
	lo, hi := key, key+1
	if len(d.c) > 0 {
		lo, hi = min(lo, d.lo), max(hi, d.lo+len(d.c))
	}
	lo -= denseSlack
	hi += denseSlack
	c := make([]uint64, hi-lo)
	if len(d.c) > 0 {
		copy(c[d.lo-lo:], d.c)
	}
	d.lo, d.c = lo, c
}

func (d *denseBuckets) reset() { clear(d.c) }

// halve merges each pair of keys into key ⌈k/2⌉ (one schema lower).
func (d *denseBuckets) halve() {
	if len(d.c) == 0 {
		return
	}
	old, oldLo := d.c, d.lo
	d.lo, d.c = ceilHalf(oldLo)-denseSlack, make([]uint64, ceilHalf(oldLo+len(old)-1)-ceilHalf(oldLo)+1+2*denseSlack)
	for i, n := range old {
		if n != 0 {
			d.c[ceilHalf(oldLo+i)-d.lo] += n
		}
	}
}

func ceilHalf(k int) int { return (k + 1) >> 1 }

// keys adds the populated keys to set.
func (d *denseBuckets) keys(set map[int]struct{}) {
	for i, n := range d.c {
		if n != 0 {
			set[d.lo+i] = struct{}{}
		}
	}
}

// merge adds o's counts.
func (d *denseBuckets) merge(o *denseBuckets) {
	first, last := -1, -1
	for i, n := range o.c {
		if n != 0 {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if first < 0 {
		return
	}
	d.add(o.lo+first, 0)
	d.add(o.lo+last, 0)
	for i := first; i <= last; i++ {
		d.c[o.lo+i-d.lo] += o.c[i]
	}
}

// spans returns the populated buckets as client_golang's makeBuckets does:
// a new span where more than two empty buckets lie between two populated
// ones, fewer filled with zero deltas.
func (d *denseBuckets) spans() ([]*dto.BucketSpan, []int64) {
	var (
		spans       []*dto.BucketSpan
		deltas      []int64
		prev        int64
		next        int
		started     bool
		spanLen     *uint32
		appendDelta = func(c int64) {
			*spanLen++
			deltas = append(deltas, c-prev)
			prev = c
		}
	)
	for i, n := range d.c {
		if n == 0 {
			continue
		}
		k := d.lo + i
		gap := int32(k - next)
		if !started || gap > 2 {
			spanLen = new(uint32(0))
			spans = append(spans, &dto.BucketSpan{Offset: new(gap), Length: spanLen})
			started = true
		} else {
			for range gap {
				appendDelta(0)
			}
		}
		appendDelta(int64(n))
		next = k + 1
	}
	return spans, deltas
}
