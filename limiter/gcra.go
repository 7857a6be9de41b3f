package limiter

import (
	"math"
	"time"
)

// GCRA (generic cell rate algorithm) on a theoretical arrival time (TAT),
// in nanoseconds. The Lua scripts implement the same arithmetic in
// microseconds on Redis TIME; the two are kept identical so Local and Redis
// decide and settle alike.
//
// With T = 60 s / rate (time per unit) and tau = burst·T, a charge of n at
// time now is admitted iff max(tat, now) + n·T − now ≤ tau; the new TAT is
// then max(tat, now) + n·T. A TAT at or before now means a full bucket.

// maxAhead caps how far debt moves a TAT ahead of now: 1e16 ns (~115 days).
const maxAhead = 1e16

// interval is T in ns.
func (b bucket) interval() float64 { return 60e9 / b.rate }

// take charges n at now. It returns the new TAT and, when the charge does
// not fit, ok=false and how long until it would (the TAT is unchanged).
func (b bucket) take(tat, now float64, n int64) (newTAT float64, ok bool, wait float64) {
	T := b.interval()
	tau := b.burst * T
	nt := math.Max(tat, now) + float64(n)*T
	if over := nt - now - tau; over > tau*1e-9 {
		return tat, false, over
	}
	return nt, true, 0
}

// force charges n at now whatever the bucket holds (shadow mode).
func (b bucket) force(tat, now float64, n int64) float64 {
	return math.Max(tat, now) + float64(n)*b.interval()
}

// maxDebt is how far a settle may push a bucket into debt, in bursts: a
// tenant whose actual use exceeds its reservation ends at most one burst
// below empty (its TAT at most now + 2·tau), so it waits at most two
// bursts' worth of time before it is full again. The reservation (Reserve)
// covers max_tokens × n + input, so only an input estimate below the
// backend's count, or retried prefills, can run past it.
const maxDebt = 1

// adjust applies a settle delta d: a positive delta is debt, bounded by
// maxDebt bursts below empty (a TAT already beyond that, from shadow mode,
// is left alone); a negative one refunds, but never to a TAT before now,
// i.e. never beyond a full bucket.
func (b bucket) adjust(tat, now float64, d int64) float64 {
	T := b.interval()
	if d > 0 {
		limit := math.Min(now+(1+maxDebt)*b.burst*T, now+maxAhead)
		return math.Min(math.Max(tat, now)+float64(d)*T, math.Max(tat, limit))
	}
	return math.Max(tat+float64(d)*T, now)
}

// quota reports the bucket as a Quota at now for a TAT.
func (b bucket) quota(tat, now float64) Quota {
	T := b.interval()
	ahead := math.Max(tat-now, 0)
	rem := math.Floor((b.burst*T - ahead) / T)
	return Quota{
		Limit:     int64(b.rate),
		Remaining: int64(math.Max(rem, 0)),
		Reset:     durationNS(ahead),
	}
}

// durationNS converts ns to a Duration, saturating instead of overflowing
// (a tenant deep in debt has a very distant reset).
func durationNS(ns float64) time.Duration {
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(math.Ceil(ns))
}
