package proxy

import (
	"context"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/sluice-proxy/sluice/proxy/h1up"
	"github.com/sluice-proxy/sluice/routing"
)

// Picker hands out attempts on the backends of a pool: the admission
// queue, the pick and the backend's count in one call. *routing.Pool is
// the real one (through poolPicker); State.Pickers may put another in its
// place.
type Picker interface {
	Acquire(ctx context.Context, want routing.Want) (Attempt, error)
}

// Attempt is one try of a request on one backend; see routing.Attempt for
// the contract. The pipeline calls Observe when response headers arrive,
// Progress when the backend answers and for every event, and End once the
// response body is finished.
type Attempt interface {
	Backend() *routing.Backend
	Waited() time.Duration
	Observe(h http.Header, t time.Time)
	Progress(t time.Time)
	End(o routing.Outcome)
}

// poolPicker is a routing.Pool as a Picker.
type poolPicker struct{ p *routing.Pool }

func (pp poolPicker) Acquire(ctx context.Context, want routing.Want) (Attempt, error) {
	a, err := pp.p.Acquire(ctx, want)
	if err != nil {
		return nil, err // not a typed nil
	}
	return a, nil
}

// picker returns the picker of route's pool.
func (st *State) picker(route *routing.Route) Picker {
	if p := st.Pickers[route.Pool.Name()]; p != nil {
		return p
	}
	return poolPicker{route.Pool}
}

// acquire starts the request's attempt number n (0 for the first), on a
// backend not in tried: the first waits in the pool's admission queue
// (its wait is the request's queue stage) and sets the pick mark; the
// others count as retries.
func (x *exchange) acquire(n int, tried []*routing.Backend, queue bool) (Attempt, error) {
	want := routing.Want{Class: x.route.Class, Tenant: x.tenant.ID, Queue: queue && n == 0, Tried: tried,
		Prompt: x.meta.prompt(x.body), Session: x.sessionKey(), Objective: x.route.TTFTObjective}
	a, err := x.st.picker(x.route).Acquire(x.r.Context(), want)
	if n == 0 {
		x.admitted = time.Now()
		if err != nil {
			x.queueWait = routing.QueueWait(err)
			return nil, err
		}
		x.queueWait, x.picked = a.Waited(), x.admitted
		return a, nil
	}
	if err == nil {
		x.retries++
		x.h.metrics.Retry(x.route.Name)
	}
	return a, err
}

// logAttempt logs a failed upstream attempt, once, at warn: with the
// request id, the trace id ("" without one), the backend and the
// underlying error, a 502 can be traced from the log.
func (x *exchange) logAttempt(b *routing.Backend, err error) {
	x.h.log.Warn("upstream attempt failed", "request_id", x.id, "trace_id", x.traceID(), "route", x.route.Name,
		"pool", x.route.Pool.Name(), "backend", b.URL.Host, "err", err)
}

// sessionKey is the request's session-affinity key: the tenant and the
// value of the pool's session header; "" without one (see
// routing.AffinityConfig).
func (x *exchange) sessionKey() string {
	name := x.route.Pool.SessionHeader()
	if name == "" {
		return ""
	}
	v := x.r.Header.Get(name)
	if v == "" {
		return ""
	}
	return x.tenant.ID + "\x00" + v
}

// attemptCtx is a leg's context: the request's context (a client who
// leaves cancels the attempt) plus the leg's own cancel (its watchdog, a
// lost hedge, its close), with the cause context.Cause would give. It
// takes the place of a context.WithCancelCause of the request's context
// and of the context.AfterFunc h1up registered on that one per request:
// it is part of the leg (no allocation of its own), registers once on the
// request's context, and closes h1up's connection itself
// (h1up.ConnCanceler). For the other transports it is an ordinary
// context: Done, Err and AfterFunc (which context.WithCancel and
// context.AfterFunc of it use, so they start no goroutine) behave as a
// cancelCtx's.
type attemptCtx struct {
	parent context.Context
	stop   func() bool // ends the registration on parent

	mu    sync.Mutex
	err   error // nil while live; then context.Canceled or parent's Err
	cause error
	done  chan struct{} // Done's, made when first asked for
	conn  io.Closer     // h1up's connection while its exchange holds it (HoldConn)
	fns   []*ctxFunc    // AfterFunc's, run once when cancelled

	// owner is the exchange whose handler goroutine runs this attempt's
	// RoundTrip, nil for a hedged leg (its own goroutine): Waiting does
	// the exchange's work for the backend's wait on it.
	owner *exchange
}

// ctxFunc is one AfterFunc registration (a pointer: its stop finds it).
type ctxFunc struct{ f func() }

var (
	_ context.Context   = (*attemptCtx)(nil)
	_ h1up.ConnCanceler = (*attemptCtx)(nil)
	_ h1up.Waiter       = (*attemptCtx)(nil)
)

// closedDone is the Done of an attemptCtx cancelled before it was asked for.
var closedDone = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// start makes c live under parent.
func (c *attemptCtx) start(parent context.Context) {
	c.parent = parent
	c.stop = context.AfterFunc(parent, c.parentDone)
}

// parentDone runs (in its own goroutine) when the request's context ends
// while the leg watches it.
func (c *attemptCtx) parentDone() { c.cancel(nil) }

// unwatch ends the registration on the request's context (the leg's
// close; a hand-off to a loop).
func (c *attemptCtx) unwatch() {
	if c.stop != nil {
		c.stop()
	}
}

// cancel ends the attempt with cause (context.Canceled when nil). When the
// request's context ended first, its error and cause are the attempt's,
// as they would be for a child cancelCtx. The first cancel wins.
func (c *attemptCtx) cancel(cause error) {
	err := context.Canceled
	if perr := c.parent.Err(); perr != nil {
		err, cause = perr, context.Cause(c.parent)
	}
	if cause == nil {
		cause = err
	}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err, c.cause = err, cause
	if c.done == nil {
		c.done = closedDone
	} else {
		close(c.done)
	}
	conn, fns := c.conn, c.fns
	c.fns = nil // conn stays: ReleaseConn reports it was closed
	c.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
	for _, e := range fns {
		go e.f()
	}
}

// state is c's error and cause; a request's context that ended before its
// registration ran cancels c first (so Err is never nil once the request's
// is not, and Done is closed when Err is not nil).
func (c *attemptCtx) state() (err, cause error) {
	c.mu.Lock()
	err, cause = c.err, c.cause
	c.mu.Unlock()
	if err == nil && c.parent.Err() != nil {
		c.cancel(nil)
		c.mu.Lock()
		err, cause = c.err, c.cause
		c.mu.Unlock()
	}
	return err, cause
}

func (c *attemptCtx) Deadline() (time.Time, bool) { return c.parent.Deadline() }
func (c *attemptCtx) Value(key any) any           { return c.parent.Value(key) }

func (c *attemptCtx) Err() error {
	err, _ := c.state()
	return err
}

// Cause is context.Cause of c (which, for a context of its own type,
// context.Cause cannot find: it would report the request's context's).
func (c *attemptCtx) Cause() error {
	_, cause := c.state()
	return cause
}

func (c *attemptCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
	}
	return c.done
}

// AfterFunc is context.AfterFunc of c: f runs in its own goroutine once c
// is cancelled (at once when it is); stop reports whether it prevented
// that. context.WithCancel and context.AfterFunc of c use it.
func (c *attemptCtx) AfterFunc(f func()) (stop func() bool) {
	if err, _ := c.state(); err != nil {
		go f()
		return func() bool { return false }
	}
	e := &ctxFunc{f: f}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	c.fns = append(c.fns, e)
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, g := range c.fns {
			if g == e {
				c.fns = append(c.fns[:i], c.fns[i+1:]...)
				return true
			}
		}
		return false
	}
}

// Waiting runs when h1up has written the attempt's request and is about
// to wait for the answer's head (h1up.Waiter): the exchange's work for
// that window (whileWaiting) is done then, not on the first token's path.
func (c *attemptCtx) Waiting() {
	if c.owner != nil {
		c.owner.whileWaiting()
	}
}

// HoldConn makes nc the connection a cancel closes, from now on; when c
// is already cancelled it closes nc at once (h1up.ConnCanceler).
func (c *attemptCtx) HoldConn(nc io.Closer) {
	if err, _ := c.state(); err == nil {
		c.mu.Lock()
		if c.err == nil {
			c.conn = nc
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
	}
	nc.Close()
}

// ReleaseConn ends HoldConn: false when a cancel closed the connection or
// is closing it (h1up.ConnCanceler).
func (c *attemptCtx) ReleaseConn() bool {
	c.state() // a request's context that ended closes the connection now
	c.mu.Lock()
	defer c.mu.Unlock()
	c.conn = nil
	return c.err == nil
}
