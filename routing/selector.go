package routing

import (
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// Selector chooses one backend among candidates that are healthy, under
// their concurrency cap and not yet tried. cands is never empty; it is
// scratch space the selector must not keep. Implementations are safe for
// simultaneous use by multiple goroutines.
type Selector interface {
	Select(cands []*Backend, now time.Time) *Backend
}

var (
	_ Selector = LeastQueued{}
	_ Selector = LeastRequest{}
	_ Selector = (*RoundRobin)(nil)
	_ Selector = Random{}
)

// NewSelector returns the selector for a policy name (PolicyLeastQueued,
// PolicyLeastRequest, PolicyRoundRobin, PolicyRandom; "" means
// least_queued).
func NewSelector(policy string) (Selector, error) {
	switch policy {
	case PolicyLeastQueued, "", PolicyPrefixAware, PolicyPredictedTTFT: // prefix_aware, predicted_ttft: for picks without a request
		return LeastQueued{}, nil
	case PolicyLeastRequest:
		return LeastRequest{}, nil
	case PolicyRoundRobin:
		return new(RoundRobin), nil
	case PolicyRandom:
		return Random{}, nil
	}
	return nil, fmt.Errorf("unknown policy %q", policy)
}

// LeastQueued is power of two choices on Backend.Score: the engine's queue
// and running counts from the freshest sample plus this node's dispatches
// since, per unit of capacity. Two random candidates are compared, so that
// many edge nodes reading the same gauges do not all pick the same backend;
// ties go to the lower KV-cache usage, then at random.
type LeastQueued struct{}

// Select implements Selector.
func (LeastQueued) Select(cands []*Backend, now time.Time) *Backend {
	a, b := twoOf(cands)
	if b == nil {
		return a
	}
	la, lb := a.Load(now), b.Load(now)
	sa, sb := la.score(a), lb.score(b)
	switch {
	case sa < sb:
		return a
	case sb < sa:
		return b
	case la.KVCache < lb.KVCache:
		return a
	case lb.KVCache < la.KVCache:
		return b
	}
	return coin(a, b)
}

// LeastRequest is power of two choices on this node's in-flight requests,
// plus the penalty of recent failures (FailureLoad), per unit of weight;
// it ignores the engines' gauges.
type LeastRequest struct{}

// Select implements Selector.
func (LeastRequest) Select(cands []*Backend, now time.Time) *Backend {
	a, b := twoOf(cands)
	if b == nil {
		return a
	}
	la := (float64(a.InFlight()) + a.FailureLoad(now)) * float64(max(b.Config.Weight, 1))
	lb := (float64(b.InFlight()) + b.FailureLoad(now)) * float64(max(a.Config.Weight, 1))
	switch {
	case la < lb:
		return a
	case lb < la:
		return b
	}
	return coin(a, b)
}

// RoundRobin takes the candidates in turn, each weight times per round.
// Its zero value starts with the first candidate.
type RoundRobin struct{ n atomic.Uint64 }

// Select implements Selector.
func (r *RoundRobin) Select(cands []*Backend, _ time.Time) *Backend {
	return byWeight(cands, r.n.Add(1)-1)
}

// Random picks a candidate at random, in proportion to its weight.
type Random struct{}

// Select implements Selector.
func (Random) Select(cands []*Backend, _ time.Time) *Backend {
	return byWeight(cands, rand.Uint64())
}

// byWeight returns the candidate at position k of a round in which each
// candidate appears weight times.
func byWeight(cands []*Backend, k uint64) *Backend {
	total := uint64(0)
	for _, c := range cands {
		total += uint64(max(c.Config.Weight, 1))
	}
	k %= total
	for _, c := range cands {
		w := uint64(max(c.Config.Weight, 1))
		if k < w {
			return c
		}
		k -= w
	}
	return cands[len(cands)-1]
}

// twoOf returns two distinct random candidates, or the only one.
func twoOf(cands []*Backend) (a, b *Backend) {
	n := len(cands)
	if n == 1 {
		return cands[0], nil
	}
	i := rand.IntN(n)
	j := rand.IntN(n - 1)
	if j >= i {
		j++
	}
	return cands[i], cands[j]
}

func coin(a, b *Backend) *Backend {
	if rand.IntN(2) == 0 {
		return a
	}
	return b
}
