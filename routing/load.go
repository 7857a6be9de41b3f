package routing

import (
	"math"
	"time"
)

// Load is a backend's estimated load at one moment, combining the freshest
// engine sample (scraped or from a response header) with this node's own
// in-flight requests.
type Load struct {
	// InFlight is this node's requests in flight to the backend.
	InFlight int64
	// Known tells that the estimate rests on an engine sample younger than
	// the pool's stale_after. When false, the engine's state is unknown
	// and Total is this node's in-flight count: never zero load on the
	// strength of a missing or stale sample.
	Known bool
	// Total estimates the requests at the engine, running or waiting: the
	// sample's running + waiting, plus the requests this node dispatched
	// since the sample, minus those of its requests that ended since
	// (never less than InFlight).
	Total float64
	// Waiting estimates the engine's queue: the sample's waiting count
	// moved by the same change (with max_batch known and no queue in the
	// sample, new requests fill free slots first), and with max_batch
	// known at least the part of Total beyond the batch slots. Negative
	// when unknown (no fresh sample and no max_batch).
	Waiting float64
	// KVCache is the sample's KV-cache usage in [0, 1]; negative when
	// unknown.
	KVCache float64
	// Sample is the sample used, nil when none is fresh.
	Sample *Sample
	// Failures is the decaying penalty of the backend's recent failed
	// attempts, in requests (see FailureLoad); the score adds it.
	Failures float64
}

// sample returns the freshest of the backend's samples, or nil when none
// is younger than the pool's stale_after at now.
func (b *Backend) sample(now time.Time) *Sample {
	s, h := b.scraped.Load(), b.header.Load()
	if s == nil || (h != nil && h.At.After(s.At)) {
		s = h
	}
	if s == nil || now.Sub(s.At) > b.pool.cfg.StaleAfter {
		return nil
	}
	return s
}

// Load estimates the backend's load at now.
func (b *Backend) Load(now time.Time) Load {
	in := b.inflight.Load()
	l := Load{InFlight: in, Total: float64(in), Waiting: -1, KVCache: -1, Failures: b.FailureLoad(now)}
	slots := float64(b.Config.MaxBatch)
	if s := b.sample(now); s != nil {
		delta := float64(in - s.inflight)
		l.Known, l.Sample, l.KVCache = true, s, s.KVCache
		l.Total = max(s.Waiting+s.Running+delta, float64(in))
		l.Waiting = max(s.Waiting+delta, 0)
		if slots > 0 && s.Waiting == 0 {
			l.Waiting = 0 // no queue yet: dispatches take free slots first
		}
	}
	if slots > 0 {
		l.Waiting = max(l.Waiting, l.Total-slots, 0)
	}
	return l
}

// capacity is the divisor that makes scores comparable across backends:
// weight × batch slots (slots count as 1 when unknown).
func (b *Backend) capacity() float64 {
	return float64(max(b.Config.Weight, 1) * max(b.Config.MaxBatch, 1))
}

// Score is the backend's load score for least_queued at now: (Total +
// Waiting + Failures) / (weight × max_batch), so that queued requests
// count twice (they wait for a slot and then run), recent failures count
// as requests held (see failPenalty) and a larger or heavier-weighted
// backend takes proportionally more. Lower is better.
func (b *Backend) Score(now time.Time) float64 {
	return b.Load(now).score(b)
}

func (l Load) score(b *Backend) float64 {
	return (l.Total + max(l.Waiting, 0) + l.Failures) / b.capacity()
}

// Failed attempts weigh on a backend's score for a while (issue 20): a
// backend that aborts its streams mid-way (or fails them before the first
// event) frees its slots early, so by its load alone it looks the least
// loaded and would draw most picks until passive health ejects it. Each
// failure counts as failPenalty requests in flight, decaying by half
// every failHalfLife (about a stream's length).
const (
	failPenalty  = 4.0
	failHalfLife = 10 * time.Second
)

// failLoad is a backend's failure penalty v as of time at (unix ns).
type failLoad struct {
	v  float64
	at int64
}

// decayed is the penalty at now.
func (f *failLoad) decayed(now int64) float64 {
	if f == nil {
		return 0
	}
	if dt := now - f.at; dt > 0 {
		return f.v * math.Exp2(-float64(dt)/float64(failHalfLife))
	}
	return f.v
}

// addFailLoad adds one failure's penalty at t.
func (b *Backend) addFailLoad(t time.Time) {
	now := t.UnixNano()
	for {
		old := b.failLoad.Load()
		nf := &failLoad{v: old.decayed(now) + failPenalty, at: max(now, atOf(old))}
		if b.failLoad.CompareAndSwap(old, nf) {
			return
		}
	}
}

func atOf(f *failLoad) int64 {
	if f == nil {
		return 0
	}
	return f.at
}

// FailureLoad is the penalty of the backend's recent failures at now, in
// requests in flight (see failPenalty); below 0.01 it is 0.
func (b *Backend) FailureLoad(now time.Time) float64 {
	v := b.failLoad.Load().decayed(now.UnixNano())
	if v < 0.01 {
		return 0
	}
	return v
}

// unlimited is the room of a backend that no queue target limits.
const unlimited = math.MaxInt32

// room is how many more requests the backend takes before it reaches the
// queue's target at now; 0 when unhealthy or at target.
func (b *Backend) room(now time.Time, q QueueConfig) int {
	if !b.Healthy(now) {
		return 0
	}
	r := unlimited
	if mc := b.Config.MaxConcurrency; mc > 0 {
		r = min(r, mc-int(b.inflight.Load()))
	}
	if q.MaxWaiting <= 0 && q.TargetUtilization <= 0 {
		return max(r, 0)
	}
	l := b.Load(now)
	slots := float64(b.Config.MaxBatch)
	if u := q.TargetUtilization; u > 0 && slots > 0 {
		r = min(r, int(math.Ceil(u*slots-l.Total)))
	}
	if w := float64(q.MaxWaiting); w > 0 && l.Waiting >= 0 {
		free := 0.0
		if l.Waiting == 0 && slots > 0 {
			free = max(slots-l.Total, 0) // free batch slots come before the queue
		}
		r = min(r, int(math.Ceil(w-l.Waiting+free)))
	}
	return max(r, 0)
}
