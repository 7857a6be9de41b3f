package proxy

import (
	"context"
	"net/http"
	"time"

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
