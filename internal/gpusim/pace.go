package gpusim

import (
	"time"
)

// startPacer produces q's tokens on q's own timer (Config.Pace) instead of
// the batch scheduler: token i at arrival + prefill + i × Pace. The
// returned stop ends the pacer (a client that went away) and waits for it
// to exit; the handler calls it before returning.
func (s *Sim) startPacer(q *seq) (stop func()) {
	q.arrived = time.Now()
	quit := make(chan struct{})
	exited := make(chan struct{})
	s.running.Add(1)
	go s.pace(q, quit, exited)
	return func() {
		close(quit)
		<-exited
	}
}

// pace is the pacer goroutine of q, owned by the handler that started it:
// it exits when q has all its tokens, when quit is closed or when the Sim
// closes. A pacer that wakes late (a busy CPU) produces every token due by
// then at once, so the schedule never drifts; the handler then sends them
// in one write, as it does for a slow reader.
func (s *Sim) pace(q *seq, quit <-chan struct{}, exited chan<- struct{}) {
	defer close(exited)
	defer s.running.Add(-1)
	m := s.metrics
	cfg := &s.cfg
	m.queue.Observe(0)
	m.promptTokens.Add(float64(q.prompt))
	start := q.arrived.Add(cfg.prefill(q.prompt))
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	k := 0 // tokens produced
	for k < q.steps {
		due := start.Add(time.Duration(k) * cfg.Pace) // token k (from 0)
		if d := time.Until(due); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-quit:
				m.success.WithLabelValues("abort").Inc()
				return
			case <-s.closing:
				return
			}
		}
		now := time.Now()
		n := min(q.steps, 1+int(now.Sub(start)/cfg.Pace)) // tokens due by now
		if k == 0 {
			q.first = now
			m.ttft.Observe(now.Sub(q.arrived).Seconds())
			m.prefill.Observe(now.Sub(q.arrived).Seconds())
		} else {
			m.itl.Observe(now.Sub(q.last).Seconds())
		}
		m.genTokens.Add(float64(n - k))
		q.last = now
		k = n
		q.produced.Store(int64(k))
		if k == q.steps {
			q.finished.Store(true)
		}
		q.wake()
	}
	m.e2e.Observe(q.last.Sub(q.arrived).Seconds())
	m.decode.Observe(q.last.Sub(q.first).Seconds())
	m.success.WithLabelValues(q.finish).Inc()
}
