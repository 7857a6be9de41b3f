package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-proxy/sluice/proxy/listen"
	"github.com/sluice-proxy/sluice/routing"
)

// errHedgeLost cancels the slower leg of a hedged request.
var errHedgeLost = errors.New("another backend answered first")

// How a ready leg is relayed.
const (
	modeEvents = iota // an OpenAI event stream, first event held
	modeRaw           // any event stream, relayed from its headers
	modeBody          // a non-streamed body, its head read (see respbody.go)
)

// leg is one attempt on one backend, up to the point where it could be
// committed to the client: response headers and, for an OpenAI stream, the
// first event; for a non-streamed answer, its head (respbody.go). Nothing reaches
// the client before a leg wins, so a failed leg can be retried and a hedged
// one dropped. A leg is used by one goroutine at a time.
type leg struct {
	x   *exchange
	att Attempt
	b   *routing.Backend // att's backend
	ctx attemptCtx       // the attempt's context (&l.ctx where a context.Context is wanted)
	wd  watchdog

	resp           *http.Response
	headers, first time.Time // response headers; first event (or whole body)
	mode           int
	br             *bufio.Reader // modeEvents: positioned after ev
	bufp           *[]byte       // modeEvents: pooled buffer holding ev
	ev             []byte        // modeEvents: the held first event
	body           []byte        // modeBody: the head read, in window
	more           bool          // modeBody: the body goes on past the head
	window         *[]byte       // modeBody: pooled, reserved from response_memory_bytes
	out            bodyOut       // modeBody: the client's writer (in the leg: no allocation)
	err            error
	outcome        routing.Outcome // ended with, for the backend's health
	closed         bool

	race   *race // nil unless hedging
	hedge  bool  // the second leg of a race
	winner bool  // relayed to the client

	sent *atomic.Bool // the whole request body was written (see accepted, watchSent)
	span trace.Span   // the attempt's CLIENT span; nil when tracing is off
}

// newLeg starts a leg on attempt a in l's storage and arms the
// first-token watchdog. Storage that held a leg before (a retry's) is not
// used again: that leg's watchdog and its registration on the request's
// context may still run late on it; the retry gets its own.
func (x *exchange) newLeg(a Attempt, l *leg) *leg {
	if l.x != nil {
		l = new(leg)
	}
	*l = leg{x: x, att: a, b: a.Backend()}
	if x.trace != nil {
		l.startSpan()
	}
	l.ctx.start(x.r.Context())
	timeout := x.st.Config.FirstTokenTimeout
	if x.policy.FirstTokenTimeout > 0 {
		timeout = x.policy.FirstTokenTimeout
	}
	l.wd.t = time.AfterFunc(timeout, l.watchdogFired)
	return l
}

// watchdogFired cancels an attempt whose backend is too slow: first with
// errFirstTokenTimeout, and, once events flow, with errStreamIdle.
func (l *leg) watchdogFired() {
	if l.wd.started.Load() {
		l.ctx.cancel(errStreamIdle)
	} else {
		l.ctx.cancel(errFirstTokenTimeout)
	}
}

// open sends the request and reads up to the first event. On failure it
// sets l.err and closes the leg.
func (l *leg) open() {
	x := l.x
	req, err := x.upstreamRequest(&l.ctx, l.b)
	if err != nil {
		l.fail(err, false)
		return
	}
	if l.span != nil {
		l.injectSpan(req.Header) // the backend continues the trace under this attempt
	}
	l.watchSent(req)
	resp, err := x.transport().RoundTrip(req)
	if err != nil {
		l.fail(causeOf(&l.ctx, err), true)
		return
	}
	l.resp, l.headers = resp, time.Now()
	l.att.Observe(resp.Header, l.headers)
	switch {
	case resp.StatusCode >= 500:
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		l.fail(&upstreamStatus{resp: resp, body: body}, true)
	case resp.StatusCode == http.StatusOK && isEventStream(resp.Header) && x.policy.Kind == KindOpenAI:
		l.mode = modeEvents
		l.readFirstEvent()
	case resp.StatusCode == http.StatusOK && isEventStream(resp.Header):
		l.mode = modeRaw // generic streams may idle for long; TCP keep-alive watches them
		l.wd.stop()
		l.att.Progress(l.headers)
	default:
		l.mode = modeBody
		l.readHead()
	}
}

// readFirstEvent reads events up to the first one carrying data (comments
// before it are keep-alives, not a first token) and holds it.
func (l *leg) readFirstEvent() {
	l.br = readerPool.Get().(*bufio.Reader)
	l.br.Reset(l.resp.Body)
	l.bufp = eventPool.Get().(*[]byte)
	for {
		ev, err := readEvent(l.br, (*l.bufp)[:0])
		*l.bufp = ev[:0]
		if err != nil {
			l.fail(causeOf(&l.ctx, err), true)
			return
		}
		if EventData(ev) != nil {
			l.ev, l.first = ev, time.Now()
			l.att.Progress(l.first)
			l.wd.tick(l.x.st.Config.StreamIdleTimeout)
			return
		}
	}
}

// fail records err, logs it and closes the leg. Unless the client left,
// the node is draining or another leg won, the failure is logged once at
// warn, and, when report is set, counts against the backend's health.
func (l *leg) fail(err error, report bool) {
	l.err = err
	if l.x.r.Context().Err() == nil && !errors.Is(err, listen.ErrDraining) &&
		!errors.Is(l.ctx.Cause(), errHedgeLost) {
		if report {
			l.outcome = routing.Failed
		}
		l.x.logAttempt(l.b, err)
	}
	l.close()
}

// close releases everything the leg holds: the response body, the timers,
// the context, the pooled buffers and the attempt (the backend's count).
// It is idempotent.
func (l *leg) close() {
	if l.closed {
		return
	}
	l.closed = true
	if l.accepted() {
		if l.winner {
			l.x.winnerAccepted = true
		} else {
			l.x.prefills.Add(1)
		}
	}
	if l.resp != nil {
		l.resp.Body.Close()
	}
	l.wd.stop()
	l.ctx.cancel(context.Canceled)
	l.ctx.unwatch()
	l.releaseBuffers()
	l.releaseWindow()
	if l.span != nil {
		l.endSpan()
	}
	l.att.End(l.outcome)
}

// relay commits the winning leg to the client, relays the rest and closes
// the leg.
func (x *exchange) relay(l *leg) error {
	defer func() {
		if x.loop == nil { // else the loop's completion closes it (handoff.go)
			l.close()
		}
	}()
	x.backend, x.upstreamHeaders = l.b, l.headers
	l.winner = true // judged accepted at close: the transport may mark the body sent after the answer's head
	switch l.mode {
	case modeEvents:
		return x.relayOpenAI(l)
	case modeRaw:
		return x.relayRaw(l)
	}
	return x.relayBody(l)
}

// race coordinates a hedged request's legs. Each leg runs in its own
// goroutine and, once open, claims victory (winner) before reporting on
// out; a leg that succeeds too late closes itself. The exchange receives
// every leg's report before its handler returns (drainRace).
type race struct {
	out     chan *leg // one report per leg; capacity for all
	winner  atomic.Pointer[leg]
	legs    [2]*leg
	n       int // legs started
	pending int // legs not yet reported
}

// run opens the leg and reports it.
func (l *leg) run() {
	l.open()
	if l.err == nil && !l.race.winner.CompareAndSwap(nil, l) {
		l.err = errHedgeLost
		l.close()
	}
	l.race.out <- l
}

// race runs the request on attempt a and, when no first token has come after the
// route's hedge_after, on a second backend too. The first leg to produce a
// first token wins; the other is cancelled at once (its backend frees the
// slot). It fails only when every leg failed.
func (x *exchange) race(a Attempt, tried []*routing.Backend) (*leg, []*routing.Backend, error) {
	rc := &race{out: make(chan *leg, len(race{}.legs))}
	x.hedging = rc
	x.startLeg(rc, a, false)
	timer := time.NewTimer(x.policy.HedgeAfter)
	defer timer.Stop()
	var lastErr error
	for rc.pending > 0 {
		select {
		case l := <-rc.out:
			rc.pending--
			if l.err != nil {
				if lastErr == nil || !errors.Is(l.err, errHedgeLost) {
					lastErr = l.err
				}
				continue
			}
			for _, other := range rc.legs[:rc.n] {
				if other != l {
					other.ctx.cancel(errHedgeLost)
				}
			}
			if l.hedge {
				x.h.metrics.Hedge(x.route.Name, "won")
			}
			return l, tried, nil
		case <-timer.C:
			ha, err := x.st.picker(x.route).Acquire(x.r.Context(), routing.Want{Tried: tried})
			if err != nil {
				continue // nowhere to hedge: keep waiting for the first leg
			}
			tried = append(tried, ha.Backend())
			x.hedged = true
			x.h.metrics.Hedge(x.route.Name, "fired")
			x.startLeg(rc, ha, true)
		}
	}
	return nil, tried, lastErr
}

func (x *exchange) startLeg(rc *race, a Attempt, hedge bool) {
	l := x.newLeg(a, new(leg))
	l.race, l.hedge = rc, hedge
	rc.legs[rc.n] = l
	rc.n++
	rc.pending++
	go l.run()
}

// drainRace waits for the reports of legs still running after a race was
// decided (they were cancelled, so they end promptly): no leg goroutine
// outlives its request.
func (x *exchange) drainRace() {
	rc := x.hedging
	if rc == nil {
		return
	}
	for ; rc.pending > 0; rc.pending-- {
		<-rc.out
	}
}

// releaseBuffers gives l's read buffers back to their pools.
func (l *leg) releaseBuffers() {
	if l.br != nil {
		l.br.Reset(nil)
		readerPool.Put(l.br)
		l.br = nil
	}
	if l.bufp != nil {
		putEvent(l.bufp)
		l.bufp, l.ev = nil, nil
	}
}

// handOverBuffers returns a copy of what l's reader holds unread (the
// backend's bytes a loop must see first) and releases its read buffers:
// a stream on a loop holds none. The leg stops watching the request's
// context too: the loop watches the client from here, and the handler's
// return (which cancels that context) then starts no goroutine for the
// leg (attemptCtx).
func (l *leg) handOverBuffers() (pending []byte) {
	l.ctx.unwatch()
	if n := l.br.Buffered(); n > 0 {
		p, _ := l.br.Peek(n)
		pending = bytes.Clone(p)
	}
	l.releaseBuffers()
	return pending
}
