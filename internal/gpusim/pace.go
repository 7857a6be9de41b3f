package gpusim

import (
	"context"
	"time"
)

// pacer produces one request's tokens on the request's own clock
// (Config.Pace) instead of the batch scheduler: token i (from 0) is due at
// arrival + prefill + i × Pace. It is not a goroutine: the handler asks it
// how many tokens are due and sleeps on its timer until the next one, so a
// token costs one timer wake-up of the handler. A handler that wakes late
// (a busy CPU, a slow reader, a stall) finds every token due by then and
// sends them in one write, and the schedule never drifts. The handler owns
// the pacer and calls end when it returns.
type pacer struct {
	s      *Sim
	every  time.Duration
	steps  int    // tokens to produce (≥ 1)
	finish string // finish_reason once all are produced
	k      int    // tokens produced
	timer  *time.Timer

	arrived, start, first, last time.Time // start: when token 0 is due
}

// newPacer starts pacing j's tokens from now.
func (s *Sim) newPacer(j *job) *pacer {
	now := time.Now()
	cached := s.cachedTokens(j.prompt, j.blocks)
	if s.prefix != nil {
		j.cached = cached
	}
	p := &pacer{s: s, every: s.cfg.Pace, steps: max(j.limit, 1), finish: j.finish,
		arrived: now, start: now.Add(s.cfg.prefill(j.prompt - cached))}
	s.running.Add(1)
	s.metrics.queue.Observe(0)
	s.metrics.promptTokens.Add(float64(j.prompt))
	return p
}

func (p *pacer) progress() (int, bool) {
	if p.k < p.steps {
		if now := time.Now(); !now.Before(p.start) {
			if n := min(p.steps, 1+int(now.Sub(p.start)/p.every)); n > p.k {
				p.produce(now, n)
			}
		}
	}
	return p.k, p.k == p.steps
}

// produce records tokens p.k … n-1 as produced at now.
func (p *pacer) produce(now time.Time, n int) {
	m := p.s.metrics
	if p.k == 0 {
		p.first = now
		m.ttft.Observe(now.Sub(p.arrived).Seconds())
		m.prefill.Observe(now.Sub(p.arrived).Seconds())
	} else {
		m.itl.Observe(now.Sub(p.last).Seconds())
	}
	m.genTokens.Add(float64(n - p.k))
	p.last, p.k = now, n
	if p.k == p.steps {
		m.e2e.Observe(now.Sub(p.arrived).Seconds())
		m.decode.Observe(now.Sub(p.first).Seconds())
		m.success.WithLabelValues(p.finish).Inc()
	}
}

// wait sleeps until the next token is due.
func (p *pacer) wait(ctx context.Context) bool {
	d := time.Until(p.start.Add(time.Duration(p.k) * p.every))
	if d <= 0 {
		return true
	}
	if p.timer == nil {
		p.timer = time.NewTimer(d)
	} else {
		p.timer.Reset(d)
	}
	select {
	case <-p.timer.C:
		return true
	case <-ctx.Done():
		p.s.cancelled.Add(1)
		return false
	case <-p.s.closing:
		abort()
	}
	return false
}

// end releases the pacer: a request that did not get all its tokens
// counts as aborted, as a cancelled sequence does in the scheduler.
func (p *pacer) end() {
	if p.timer != nil {
		p.timer.Stop()
	}
	if p.k < p.steps {
		p.s.metrics.success.WithLabelValues("abort").Inc()
	}
	p.s.running.Add(-1)
}
