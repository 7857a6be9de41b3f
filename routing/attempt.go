package routing

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"
)

// Want is what a request asks of a pool for one attempt.
type Want struct {
	// Class ("interactive", the default, or "batch") and Tenant place the
	// request in the pool's admission queue.
	Class, Tenant string
	// Queue makes the attempt wait in the pool's admission queue first,
	// when the pool has targets. A request's first attempt queues; its
	// retries and hedges, already admitted, do not wait again. False
	// picks at once.
	Queue bool
	// Tried lists the backends already tried for the request; the pick
	// skips them.
	Tried []*Backend
	// Prompt is the request's raw prompt (the JSON value of its messages,
	// prompt or input member) for prefix affinity; nil when unknown. It
	// is read during Acquire only, never kept.
	Prompt []byte
	// Session is the request's session key for session affinity (the
	// tenant and the pool's session header), "" for none.
	Session string
	// Objective is the route's TTFT objective (RouteConfig.TTFTObjective);
	// zero for none. Acquire refuses with ErrTTFTObjective when every
	// candidate backend is predicted to miss it.
	Objective time.Duration

	pred prediction // the pick's TTFT prediction (predict.go)
}

// Outcome is how an attempt ended, as far as the backend's health is
// concerned.
type Outcome uint8

const (
	// Finished means the attempt ended through no fault of the backend's:
	// it answered, or the client left, the node drained, another leg of a
	// hedged request won.
	Finished Outcome = iota
	// Failed means the backend failed the attempt: it could not be
	// reached, answered 5xx, or cut or stalled the stream before its first
	// event. Consecutive failures eject the backend (passive health).
	Failed
)

// Attempt is one try of a request on one backend, from the pick to the end
// of the response body. The pool counts it on the backend from Acquire
// until End; in between the caller reports what it sees: Observe when
// response headers arrive, Progress when the backend answers and as events
// flow. An Attempt is used by one goroutine at a time.
type Attempt struct {
	b        *Backend
	waited   time.Duration
	answered bool
	ended    bool

	pred            prediction // the pick's TTFT prediction; learnt from at the first event
	picked, headers time.Time  // headers: of an event stream only
}

// Acquire starts an attempt: it waits in the admission queue when
// want.Queue is set (see Want), picks a backend with the pool's policy
// (skipping want.Tried) and counts the request on it. The admission
// queue's hold on the pool's capacity passes to the backend's count, so
// a burst of grants cannot overshoot the target.
//
// Errors match ErrQueueTimeout, ErrQueueFull or ErrNoHealthyBackend and
// carry a retry delay (RetryAfter); when the request left the queue
// because ctx ended, the error is ctx's cause. An error after a wait in
// the queue carries the wait (QueueWait).
func (p *Pool) Acquire(ctx context.Context, want Want) (*Attempt, error) {
	var adm admission
	if want.Queue {
		var err error
		if adm, err = p.enter(ctx, want.Class, want.Tenant); err != nil {
			return nil, waitedErr(err, adm.Waited)
		}
	}
	b, err := p.pickFor(want.Tried, &want)
	if err != nil {
		adm.Done()
		return nil, waitedErr(err, adm.Waited)
	}
	now := time.Now()
	if p.cfg.Policy == PolicyPredictedTTFT || want.Objective > 0 || p.aff.table == nil {
		p.predictFor(b, now, &want) // prefix_aware without an objective: not hashing the prompt twice
	}
	if want.Objective > 0 {
		if err := p.checkObjective(want.Objective, want.pred, &want, now); err != nil {
			adm.Done()
			return nil, waitedErr(err, adm.Waited)
		}
	}
	b.begin()
	adm.Done()
	return &Attempt{b: b, waited: adm.Waited, pred: want.pred, picked: now}, nil
}

// Backend is the backend the attempt runs on.
func (a *Attempt) Backend() *Backend { return a.b }

// Waited is how long the attempt waited in the admission queue; zero when
// it went straight through or did not queue.
func (a *Attempt) Waited() time.Duration { return a.waited }

// Observe records the backend's response headers, received at t: the
// backend is alive, and an endpoint-load-metrics header (ORCA TEXT or JSON
// form) is a fresh load sample.
func (a *Attempt) Observe(h http.Header, t time.Time) {
	a.b.progress(t)
	if a.headers.IsZero() && strings.HasPrefix(h.Get("Content-Type"), "text/event-stream") {
		a.headers = t
	}
	if v := h.Get("Endpoint-Load-Metrics"); v != "" {
		a.b.observeLoadHeader(v, t)
	}
}

// Progress records, at t, that the backend answered and that the stream
// goes on. Cheap enough to call on every event. Passive health judges the
// attempt at End: a stream the backend aborts mid-way is a failure, so a
// backend that answers and then cuts every stream is ejected like one that
// never answers.
func (a *Attempt) Progress(t time.Time) {
	if !a.answered && a.pred.ok && !a.headers.IsZero() && t.After(a.headers) {
		a.b.learn(a.pred, a.picked, a.headers, t) // the stream's first event
	}
	a.answered = true
	a.b.progress(t)
}

// End ends the attempt: a Failed outcome counts against the backend's
// health, and the request no longer counts on the backend, which wakes
// the pool's admission queue. Call it once the response body is finished
// (not when headers arrive); later calls do nothing.
func (a *Attempt) End(o Outcome) {
	if a.ended {
		return
	}
	a.ended = true
	switch {
	case o == Failed:
		a.b.report(false, time.Now())
	case a.answered:
		a.b.report(true, time.Now()) // the consecutive failures start again
	}
	a.b.end()
}

// waitedError is an Acquire error after a wait in the admission queue.
type waitedError struct {
	err    error
	waited time.Duration
}

func (e *waitedError) Error() string            { return e.err.Error() }
func (e *waitedError) Unwrap() error            { return e.err }
func (e *waitedError) QueueWait() time.Duration { return e.waited }

func waitedErr(err error, waited time.Duration) error {
	if waited <= 0 {
		return err
	}
	return &waitedError{err: err, waited: waited}
}

// QueueWait returns how long a request waited in the admission queue
// before Acquire failed with err; zero when it did not wait.
func QueueWait(err error) time.Duration {
	var w interface{ QueueWait() time.Duration }
	if errors.As(err, &w) {
		return w.QueueWait()
	}
	return 0
}
