package observe

import (
	"errors"
	"math"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// shardCounterVec is a counter vector whose exposition is what
// client_golang's CounterVec gives for the same additions (the version in
// go.mod): the same value, label pairs and created timestamp (the series'
// creation). What differs is where an exact-integer addition goes: into
// the shard of the P the goroutine runs on (one cache line pair per shard,
// min(GOMAXPROCS, 16) shards per series), instead of one word every core
// adds to. A scrape adds the shards. client_golang keeps exact integers
// in a uint64 and the rest in a float64 it adds to with a CAS loop; so
// does this type, the uint64 split into shards (their sum wraps as the one
// word does) and the float64 kept in one word as client_golang keeps it,
// so that the value is client_golang's bit for bit, fractions included.
//
// Not supported (not used by Sluice): exemplars, const labels, Delete,
// Reset, CurryWith.
type shardCounterVec struct {
	seriesSet[*shardCounter]
	shards int
	now    func() time.Time
}

// newShardCounterVec is prometheus.NewCounterVec for name, help and the
// label names; shards 0 means min(GOMAXPROCS, maxShards).
func newShardCounterVec(name, help string, labels []string, shards int) *shardCounterVec {
	if shards <= 0 {
		shards = min(runtime.GOMAXPROCS(0), maxShards)
	}
	v := &shardCounterVec{shards: shards, now: time.Now}
	v.seriesSet = newSeriesSet(name, help, labels, v.newCounter)
	return v
}

// newCounter makes the counter of the label values lvs.
func (v *shardCounterVec) newCounter(lvs []string) *shardCounter {
	return &shardCounter{desc: v.desc, labels: prometheus.MakeLabelPairs(v.desc, lvs),
		created: timestamppb.New(v.now()), shards: make([]counterShard, v.shards)}
}

// shardCounter is one series of a shardCounterVec: a prometheus.Counter
// without exemplars. Safe for simultaneous use by multiple goroutines.
type shardCounter struct {
	// valBits is the sum of the additions that are not exact integers
	// (client_golang's valBits), in a line of its own.
	valBits uint64
	_       [120]byte
	shards  []counterShard // exact integers (client_golang's valInt)
	desc    *prometheus.Desc
	labels  []*dto.LabelPair
	created *timestamppb.Timestamp
}

// counterShard is one shard's integer count, two cache lines wide so that
// no two shards (nor a neighbour) share a line or its prefetched pair.
type counterShard struct {
	n uint64
	_ [120]byte
}

// shard returns the integer count of the P the caller runs on.
func (c *shardCounter) shard() *uint64 {
	if len(c.shards) == 1 {
		return &c.shards[0].n
	}
	p := procPin()
	procUnpin()
	return &c.shards[uint(p)%uint(len(c.shards))].n
}

// errCounterDecrease is client_golang's panic value for a negative Add.
var errCounterDecrease = errors.New("counter cannot decrease in value")

// Add is client_golang's counter.Add: it panics when v < 0; an exact
// integer is added to the caller's shard, anything else (fractions, NaN,
// +Inf, values past 2^64) to the float word.
func (c *shardCounter) Add(v float64) {
	if v < 0 {
		panic(errCounterDecrease)
	}
	ival := uint64(v)
	if float64(ival) == v {
		atomic.AddUint64(c.shard(), ival)
		return
	}
	for {
		oldBits := atomic.LoadUint64(&c.valBits)
		newBits := math.Float64bits(math.Float64frombits(oldBits) + v)
		if atomic.CompareAndSwapUint64(&c.valBits, oldBits, newBits) {
			return
		}
	}
}

// Inc adds 1.
func (c *shardCounter) Inc() { atomic.AddUint64(c.shard(), 1) }

// value is client_golang's counter.get: the float word plus the integers.
func (c *shardCounter) value() float64 {
	fval := math.Float64frombits(atomic.LoadUint64(&c.valBits))
	var ival uint64
	for i := range c.shards {
		ival += atomic.LoadUint64(&c.shards[i].n)
	}
	return fval + float64(ival)
}

// Desc implements prometheus.Metric.
func (c *shardCounter) Desc() *prometheus.Desc { return c.desc }

// Write implements prometheus.Metric as client_golang's counter writes.
func (c *shardCounter) Write(out *dto.Metric) error {
	out.Counter = &dto.Counter{Value: new(c.value()), CreatedTimestamp: c.created}
	out.Label = c.labels
	return nil
}
