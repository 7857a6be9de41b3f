package routing

import (
	"errors"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// PolicyPredictedTTFT picks the backend with the lowest predicted time to
// first token (see PredictConfig).
const PolicyPredictedTTFT = "predicted_ttft"

// ErrTTFTObjective means every candidate backend is predicted to miss the
// route's TTFT objective. The error carries a retry delay (RetryAfter):
// the predicted excess over the objective, rounded up to whole seconds.
var ErrTTFTObjective = errors.New("every backend is predicted to miss the TTFT objective")

type objectiveError struct{ retryAfter time.Duration }

func (e *objectiveError) Error() string             { return ErrTTFTObjective.Error() }
func (e *objectiveError) Is(target error) bool      { return target == ErrTTFTObjective }
func (e *objectiveError) RetryAfter() time.Duration { return e.retryAfter }

// PredictConfig configures the TTFT prediction of a pool. Every pool
// keeps, per backend, exponentially weighted means of three figures
// measured on its own requests (from the pick to the response headers,
// and from the headers to the first streamed event):
//
//   - network: pick to response headers;
//   - prefill rate, tokens/s: (prompt tokens − expected cached) over
//     headers-to-first-event, from requests dispatched while the engine
//     had no waiting request;
//   - queue wait per waiting request: the rest of headers-to-first-event
//     divided by the requests that had to leave the engine before this
//     one got a batch slot, as estimated at dispatch (see waitingOf),
//     from requests dispatched while there were some.
//
// A request's TTFT on backend b is predicted as
//
//	network(b) + waiting(b) × queue_wait(b) + (prompt − cached(b)) / rate(b)
//
// with prompt tokens estimated at four bytes of prompt JSON a token and
// cached(b) from the pool's prefix table (Pool.ExpectedCachedTokens).
// Policy predicted_ttft picks the lowest prediction; a route's
// ttft_objective refuses requests predicted to miss it on every
// candidate, under any policy.
type PredictConfig struct {
	// PrefillRate is the prefill rate, in prompt tokens per second,
	// assumed for a backend before its first measurement. Default 10000.
	PrefillRate float64 `yaml:"prefill_rate"`
	// QueueWait is the wait per waiting request assumed before the first
	// measurement. Default 50ms.
	QueueWait time.Duration `yaml:"queue_wait"`
	// Alpha is the weight of a new measurement in the means (0 to 1).
	// Default 0.2.
	Alpha float64 `yaml:"alpha"`
}

// WithDefaults returns c with zero fields set to their defaults.
func (c PredictConfig) WithDefaults() PredictConfig {
	if c.PrefillRate == 0 {
		c.PrefillRate = 10000
	}
	if c.QueueWait == 0 {
		c.QueueWait = 50 * time.Millisecond
	}
	if c.Alpha == 0 {
		c.Alpha = 0.2
	}
	return c
}

func (c PredictConfig) validate() []FieldError {
	var errs []FieldError
	bad := func(key, msg string) {
		errs = append(errs, FieldError{Key: "predict." + key, Msg: "predict." + key + " " + msg})
	}
	if !(c.PrefillRate > 0) || math.IsInf(c.PrefillRate, 0) {
		bad("prefill_rate", "must be a positive finite number of tokens per second")
	}
	if c.QueueWait < 0 || c.QueueWait > time.Minute {
		bad("queue_wait", "must be from 0 to 1m")
	}
	if !(c.Alpha > 0 && c.Alpha <= 1) {
		bad("alpha", "must be above 0 and at most 1")
	}
	return errs
}

// errBounds are the upper bounds, in ms, of the prediction-error
// histogram's buckets (predicted − actual; the last bucket is +Inf).
var errBounds = [...]float64{-5000, -2000, -1000, -500, -200, -100, -50, -20, -10, -5, -2, 0,
	2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000}

// predictor is a backend's measured means and prediction-error histogram;
// lock-free.
type predictor struct {
	net, rate, wait atomic.Uint64 // float64 bits: seconds, tokens/s, seconds; 0: not measured
	errCount        [len(errBounds) + 1]atomic.Int64
	errSumUS        atomic.Int64 // microseconds, for the histogram's sum
}

func loadF(a *atomic.Uint64) float64 { return math.Float64frombits(a.Load()) }

// ewma folds v into the mean in a with weight alpha (the first value is
// taken as it is).
func ewma(a *atomic.Uint64, v, alpha float64) {
	for {
		old := a.Load()
		m := math.Float64frombits(old)
		n := v
		if old != 0 {
			n = m + alpha*(v-m)
		}
		if a.CompareAndSwap(old, math.Float64bits(n)) {
			return
		}
	}
}

// PredictStats are a backend's prediction figures.
type PredictStats struct {
	// Network, QueueWait are the measured means (the configured priors
	// until measured); PrefillRate is in tokens/s.
	Network, QueueWait time.Duration
	PrefillRate        float64
	// Errors counts predictions checked against a first token; ErrP50,
	// ErrP95 are percentiles of predicted − actual (bucket upper bounds,
	// so within one bucket), valid when Errors > 0.
	Errors         int64
	ErrP50, ErrP95 time.Duration
	// Buckets are the histogram's cumulative counts at ErrBounds; SumSec
	// the sum of errors in seconds.
	Buckets []uint64
	SumSec  float64
}

// ErrBoundsSeconds are the prediction-error histogram's bucket upper
// bounds in seconds (the implicit last is +Inf).
func ErrBoundsSeconds() []float64 {
	out := make([]float64, len(errBounds))
	for i, v := range errBounds {
		out[i] = v / 1000
	}
	return out
}

// PredictStats returns the backend's prediction figures.
func (b *Backend) PredictStats() PredictStats {
	c := b.pool.cfg.Predict
	st := PredictStats{Network: time.Duration(loadF(&b.pred.net) * 1e9), QueueWait: c.QueueWait, PrefillRate: c.PrefillRate}
	if w := loadF(&b.pred.wait); b.pred.wait.Load() != 0 {
		st.QueueWait = time.Duration(w * 1e9)
	}
	if r := loadF(&b.pred.rate); r > 0 {
		st.PrefillRate = r
	}
	var counts [len(errBounds) + 1]int64
	for i := range counts {
		counts[i] = b.pred.errCount[i].Load()
		st.Errors += counts[i]
	}
	st.SumSec = float64(b.pred.errSumUS.Load()) / 1e6
	st.Buckets = make([]uint64, len(errBounds))
	cum := int64(0)
	for i := range errBounds {
		cum += counts[i]
		st.Buckets[i] = uint64(cum)
	}
	q := func(f float64) time.Duration {
		want, cum := int64(math.Ceil(f*float64(st.Errors))), int64(0)
		for i, n := range counts {
			cum += n
			if cum >= want {
				if i == len(errBounds) {
					return time.Duration(errBounds[i-1] * 1e6) // beyond the last bound: report it
				}
				return time.Duration(errBounds[i] * 1e6)
			}
		}
		return 0
	}
	if st.Errors > 0 {
		st.ErrP50, st.ErrP95 = q(0.5), q(0.95)
	}
	return st
}

// waitingOf is how many requests must leave the engine before a new one
// gets a batch slot: with max_batch known, the estimated requests at the
// engine beyond the slots, plus one, once every slot is taken; else the
// engine's waiting count plus one when it has a queue; with the engine's
// state unknown, this node's in-flight requests (a conservative guess).
func waitingOf(b *Backend, l Load) float64 {
	slots := float64(b.Config.MaxBatch)
	switch {
	case slots > 0 && l.Total >= slots:
		return l.Total - slots + 1
	case slots > 0:
		return 0
	case l.Waiting > 0:
		return l.Waiting + 1
	case l.Waiting == 0:
		return 0
	}
	return float64(l.InFlight)
}

// predict is the backend's predicted TTFT for uncached prompt tokens
// with waiting requests ahead, and its queue part.
func (b *Backend) predict(uncached, waiting float64) (total, queue time.Duration) {
	c := &b.pool.cfg.Predict
	rate := loadF(&b.pred.rate)
	if rate <= 0 {
		rate = c.PrefillRate
	}
	wait := c.QueueWait.Seconds()
	if b.pred.wait.Load() != 0 {
		wait = loadF(&b.pred.wait)
	}
	q := waiting * wait
	s := loadF(&b.pred.net) + q + uncached/rate
	return time.Duration(s * 1e9), time.Duration(q * 1e9)
}

// promptTokens estimates a prompt's tokens from its JSON bytes.
func promptTokens(prompt []byte) int { return len(prompt) / 4 }

// chooseTTFT picks, among cands, the backend with the lowest predicted
// TTFT for want's prompt (ties at random), records it in the prefix
// table, and leaves the prediction in want.
func (p *Pool) chooseTTFT(cands []*Backend, now time.Time, want *Want) *Backend {
	a := p.aff
	tokens := promptTokens(want.Prompt)
	var matched [16]int
	m := matched[:0]
	if len(cands) > len(matched) {
		m = make([]int, 0, len(cands))
	}
	m = m[:len(cands)]
	var blocks []uint64
	known := 0            // leading blocks the table knows
	var front [256]uint16 // the most recent backend of each known block (the first 256)
	if a.table != nil && len(want.Prompt) > 0 {
		bp := a.blocks.Get().(*[]uint64)
		defer a.blocks.Put(bp)
		blocks = hashBlocks((*bp)[:0], want.Prompt, a.cfg.BlockBytes, a.cfg.MaxBlocks)
		*bp = blocks
		known = a.matchBlocks(blocks, cands, m, &front)
	}
	tokensPerBlock := a.cfg.BlockBytes / 4
	best, off := -1, rand.IntN(len(cands))
	var bestPred time.Duration
	var bestWaiting float64
	for j := range cands {
		i := (j + off) % len(cands)
		c := cands[i]
		w := waitingOf(c, c.Load(now))
		pr, _ := c.predict(float64(max(tokens-m[i]*tokensPerBlock, 0)), w)
		if best < 0 || pr < bestPred {
			best, bestPred, bestWaiting = i, pr, w
		}
	}
	b := cands[best]
	want.pred = prediction{ok: true, at: bestPred, tokens: tokens, cached: min(m[best]*tokensPerBlock, tokens), waiting: bestWaiting}
	if a.table != nil {
		a.recordBlocks(blocks, known, &front, b)
	}
	return b
}

// prediction is a pick's prediction, kept by the attempt to learn from.
type prediction struct {
	ok             bool
	at             time.Duration // predicted TTFT from the pick
	tokens, cached int
	waiting        float64
}

// predictFor fills want.pred for backend b when the pick did not.
func (p *Pool) predictFor(b *Backend, now time.Time, want *Want) {
	if want.pred.ok {
		return
	}
	tokens := promptTokens(want.Prompt)
	cached := 0
	if len(want.Prompt) > 0 {
		cached = min(p.ExpectedCachedTokens(b, want.Prompt), tokens)
	}
	w := waitingOf(b, b.Load(now))
	pr, _ := b.predict(float64(tokens-cached), w)
	want.pred = prediction{ok: true, at: pr, tokens: tokens, cached: cached, waiting: w}
}

// checkObjective returns an ErrTTFTObjective error when every candidate
// (healthy, under cap, untried) is predicted to miss objective; chosen's
// prediction is pred. Under policy predicted_ttft the chosen backend is
// the lowest; under others the rest are predicted too.
func (p *Pool) checkObjective(objective time.Duration, pred prediction, want *Want, now time.Time) error {
	if pred.at <= objective {
		return nil
	}
	least := pred.at
	if p.cfg.Policy != PolicyPredictedTTFT {
		for _, c := range p.backends {
			if !c.Healthy(now) || c.atCap() || isTried(want.Tried, c) {
				continue
			}
			cached := 0
			if len(want.Prompt) > 0 {
				cached = min(p.ExpectedCachedTokens(c, want.Prompt), pred.tokens)
			}
			pr, _ := c.predict(float64(pred.tokens-cached), waitingOf(c, c.Load(now)))
			least = min(least, pr)
		}
	}
	if least <= objective {
		return nil
	}
	p.objRefused.Add(1)
	excess := least - objective
	return &objectiveError{retryAfter: max(time.Duration(math.Ceil(excess.Seconds()))*time.Second, time.Second)}
}

// ObjectiveRefusals counts the requests refused because every backend
// was predicted to miss their route's TTFT objective.
func (p *Pool) ObjectiveRefusals() int64 { return p.objRefused.Load() }

// learn folds an attempt's measurements into its backend's means and
// records the prediction error: picked, headers and first are the pick,
// the response headers and the first event.
func (b *Backend) learn(pr prediction, picked, headers, first time.Time) {
	if !pr.ok || headers.IsZero() || !first.After(headers) || headers.Before(picked) {
		return
	}
	c := &b.pool.cfg.Predict
	actual := first.Sub(picked)
	e := pr.at - actual
	ms := float64(e) / 1e6
	i := 0
	for i < len(errBounds) && ms > errBounds[i] {
		i++
	}
	b.pred.errCount[i].Add(1)
	b.pred.errSumUS.Add(int64(e / time.Microsecond))

	ewma(&b.pred.net, max(headers.Sub(picked).Seconds(), 1e-6), c.Alpha)
	engine := first.Sub(headers).Seconds()
	uncached := float64(pr.tokens - pr.cached)
	if pr.waiting < 0.5 {
		if uncached >= 16 && engine > 0 {
			ewma(&b.pred.rate, uncached/engine, c.Alpha)
		}
		return
	}
	rate := loadF(&b.pred.rate)
	if rate <= 0 {
		rate = c.PrefillRate
	}
	ewma(&b.pred.wait, max((engine-uncached/rate)/pr.waiting, 1e-6), c.Alpha)
}
