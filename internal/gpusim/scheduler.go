package gpusim

import (
	"sync/atomic"
	"time"
)

// seq is one request's sequence in the engine.
//
// The handler fills the read-only part before submitting it and then only
// reads produced/finished and waits on notify. The scheduler owns the
// rest. Tokens are not passed: they are a pure function of (seed, index),
// so the scheduler only counts them and the handler renders them. That is
// how emitting a token never blocks the scheduler: a slow reader merely
// falls behind, and when it wakes it sends everything produced so far. A
// real engine does the same: vLLM keeps decoding a sequence whose client
// reads slowly and buffers (coalesces) its output until the client catches
// up or goes away.
type seq struct {
	// Read-only once submitted.
	prompt  int       // prompt tokens
	blocks  []uint64  // the prompt's block hashes for the prefix cache
	steps   int       // tokens the engine generates (≥ 1)
	reserve int       // KV-cache tokens reserved at admission
	finish  string    // finish_reason when all steps are done
	arrived time.Time // when the handler submitted it
	notify  chan struct{}

	// Written by the scheduler, read by the handler.
	produced atomic.Int64 // tokens generated so far
	cached   atomic.Int64 // prompt tokens found in the prefix cache, set at admission
	finished atomic.Bool  // set after the last produced increment

	// Owned by the scheduler.
	state    seqState
	idx      int // position in scheduler.running
	admitted time.Time
	first    time.Time // first token
	last     time.Time // latest token
}

type seqState uint8

const (
	stateNew seqState = iota
	stateWaiting
	stateRunning
	stateGone // finished or cancelled
)

func newSeq(prompt, steps int, finish string) *seq {
	return &seq{
		prompt:  prompt,
		steps:   max(steps, 1),
		reserve: prompt + max(steps, 1),
		finish:  finish,
		notify:  make(chan struct{}, 1),
	}
}

// wake tells the handler that q made progress, without ever blocking.
func (q *seq) wake() {
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// seqEvent is a submission or a cancellation. Both travel on one channel so
// a handler's cancel can never overtake its own submit.
type seqEvent struct {
	q      *seq
	cancel bool
}

// scheduler is the engine state, owned by the Sim.schedule goroutine.
type scheduler struct {
	cfg      Config
	running  []*seq
	waiting  []*seq // FIFO from head; cancelled entries are skipped lazily
	head     int
	nWaiting int
	reserved int // KV tokens reserved by running sequences
	held     int // KV tokens held by running sequences
}

func (sc *scheduler) init(cfg Config) {
	sc.cfg = cfg
	sc.running = make([]*seq, 0, cfg.MaxBatch)
}

// schedule is the scheduler goroutine: it runs from New until Close. It
// blocks when there is no work; otherwise it runs one step at a time,
// staying responsive to submissions and cancellations during a step.
func (s *Sim) schedule() {
	defer close(s.exited)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	stepping := false
	for {
		if !stepping {
			if d, ok := s.startStep(time.Now()); ok {
				timer.Reset(d)
				stepping = true
			}
		}
		var tick <-chan time.Time
		if stepping {
			tick = timer.C
		}
		select {
		case ev := <-s.events:
			s.handleEvent(ev)
		case now := <-tick:
			s.finishStep(now)
			stepping = false
		case <-s.closing:
			timer.Stop()
			return
		}
	}
}

func (s *Sim) handleEvent(ev seqEvent) {
	sc := &s.sched
	q := ev.q
	switch {
	case !ev.cancel && q.state == stateNew:
		q.state = stateWaiting
		sc.waiting = append(sc.waiting, q)
		sc.nWaiting++
	case ev.cancel && q.state == stateWaiting:
		q.state = stateGone
		sc.nWaiting--
		s.metrics.success.WithLabelValues("abort").Inc()
	case ev.cancel && q.state == stateRunning:
		sc.removeRunning(q)
		s.metrics.success.WithLabelValues("abort").Inc()
	}
	s.publish()
}

// startStep admits waiting sequences into free batch slots and returns the
// length of the next step: StepBase + StepPerSeq × batch size, plus the
// prefill of every sequence admitted now (it delays the whole batch, as a
// prefill mixed into a vLLM step does). ok is false when nothing runs.
func (s *Sim) startStep(now time.Time) (d time.Duration, ok bool) {
	sc := &s.sched
	var prefill time.Duration
	for len(sc.running) < sc.cfg.MaxBatch {
		q := sc.peek()
		if q == nil || sc.reserved+q.reserve > sc.cfg.KVCacheTokens {
			break
		}
		sc.pop()
		sc.admit(q, now)
		s.metrics.queue.Observe(now.Sub(q.arrived).Seconds())
		s.metrics.promptTokens.Add(float64(q.prompt))
		cached := s.cachedTokens(q.prompt, q.blocks)
		q.cached.Store(int64(cached))
		prefill += sc.cfg.prefill(q.prompt - cached)
	}
	s.publish()
	if len(sc.running) == 0 {
		return 0, false
	}
	return sc.cfg.step(len(sc.running)) + prefill, true
}

// finishStep ends a step: every running sequence gets one token; those
// that reach their length finish and leave the batch.
func (s *Sim) finishStep(now time.Time) {
	sc := &s.sched
	m := s.metrics
	m.genTokens.Add(float64(len(sc.running)))
	for i := 0; i < len(sc.running); {
		q := sc.running[i]
		k := int(q.produced.Add(1))
		sc.held++
		if k == 1 {
			q.first = now
			m.ttft.Observe(now.Sub(q.arrived).Seconds())
			m.prefill.Observe(now.Sub(q.admitted).Seconds())
		} else {
			m.itl.Observe(now.Sub(q.last).Seconds())
		}
		q.last = now
		if k < q.steps {
			q.wake()
			i++
			continue
		}
		sc.removeRunning(q) // moves another sequence into slot i
		// Recorded before the handler learns the sequence finished, so
		// the metrics of an answered request are always visible.
		m.e2e.Observe(now.Sub(q.arrived).Seconds())
		m.decode.Observe(now.Sub(q.first).Seconds())
		m.success.WithLabelValues(q.finish).Inc()
		q.finished.Store(true)
		q.wake()
	}
	s.publish()
}

// publish makes the scheduler's load visible to Stats, metrics and headers.
func (s *Sim) publish() {
	s.running.Store(int64(len(s.sched.running)))
	s.waiting.Store(int64(s.sched.nWaiting))
	s.kvHeld.Store(int64(s.sched.held))
}

func (sc *scheduler) admit(q *seq, now time.Time) {
	q.state = stateRunning
	q.idx = len(sc.running)
	q.admitted = now
	sc.running = append(sc.running, q)
	sc.reserved += q.reserve
	sc.held += q.prompt
}

// removeRunning takes q out of the batch (swap with the last) and releases
// its KV cache.
func (sc *scheduler) removeRunning(q *seq) {
	last := len(sc.running) - 1
	moved := sc.running[last]
	sc.running[q.idx] = moved
	moved.idx = q.idx
	sc.running[last] = nil
	sc.running = sc.running[:last]
	sc.reserved -= q.reserve
	sc.held -= q.prompt + int(q.produced.Load())
	q.state = stateGone
}

// peek returns the first live waiting sequence, dropping cancelled ones.
func (sc *scheduler) peek() *seq {
	for sc.head < len(sc.waiting) {
		if q := sc.waiting[sc.head]; q.state == stateWaiting {
			return q
		}
		sc.waiting[sc.head] = nil
		sc.head++
	}
	sc.waiting, sc.head = sc.waiting[:0], 0
	return nil
}

// pop removes the sequence peek returned.
func (sc *scheduler) pop() {
	sc.waiting[sc.head] = nil
	sc.head++
	sc.nWaiting--
	if sc.head > 64 && sc.head*2 > len(sc.waiting) {
		n := copy(sc.waiting, sc.waiting[sc.head:])
		clear(sc.waiting[n:])
		sc.waiting, sc.head = sc.waiting[:n], 0
	}
}
