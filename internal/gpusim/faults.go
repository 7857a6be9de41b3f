package gpusim

import (
	"context"
	"net/http"
	"strconv"
	"time"
)

// Request headers that override the fault knobs for one request, so a test
// can target a single request. Each overrides the Config field named.
const (
	// HeaderFail: "before-first" fails the request with a 500 before its
	// first token; "none" disables FailBeforeFirst for this request.
	HeaderFail = "X-Sim-Fail"
	// HeaderDieAfter: N aborts the response after N tokens (DieAfterTokens;
	// 0 disables).
	HeaderDieAfter = "X-Sim-Die-After"
	// HeaderStallAfter: N stalls the response after N tokens
	// (StallAfterTokens; 0 disables).
	HeaderStallAfter = "X-Sim-Stall-After"
	// HeaderStallFor: a Go duration ("2s"), how long a stall lasts
	// (StallFor; 0 = until the client goes away).
	HeaderStallFor = "X-Sim-Stall-For"
	// HeaderSlowStart: a Go duration, the delay before the response
	// headers (SlowStart).
	HeaderSlowStart = "X-Sim-Slow-Start"
)

// faults are the fault settings of one request.
type faults struct {
	failFirst  bool
	dieAfter   int // 0: never
	stallAfter int // 0: never
	stallFor   time.Duration
	slowStart  time.Duration
}

// faultsFor merges the Config knobs with r's X-Sim-* headers. It draws from
// the FailBeforeFirst sequence for every generation request, header or not,
// so the sequence depends only on arrival order.
func (s *Sim) faultsFor(r *http.Request) (faults, *apiError) {
	f := faults{
		failFirst:  s.drawFailure(),
		dieAfter:   s.cfg.DieAfterTokens,
		stallAfter: s.cfg.StallAfterTokens,
		stallFor:   s.cfg.StallFor,
		slowStart:  s.cfg.SlowStart,
	}
	switch v := r.Header.Get(HeaderFail); v {
	case "":
	case "before-first":
		f.failFirst = true
	case "none":
		f.failFirst = false
	default:
		return f, badRequest("invalid_header", "%s: %q is not before-first or none", HeaderFail, v)
	}
	var e *apiError
	headerInt(r, HeaderDieAfter, &f.dieAfter, &e)
	headerInt(r, HeaderStallAfter, &f.stallAfter, &e)
	headerDuration(r, HeaderStallFor, &f.stallFor, &e)
	headerDuration(r, HeaderSlowStart, &f.slowStart, &e)
	return f, e
}

func (s *Sim) drawFailure() bool {
	if s.cfg.FailBeforeFirst <= 0 {
		return false
	}
	s.failMu.Lock()
	defer s.failMu.Unlock()
	return s.failRNG.Float64() < s.cfg.FailBeforeFirst
}

// headerInt sets *dst from header name when present; a bad value sets *e.
func headerInt(r *http.Request, name string, dst *int, e **apiError) {
	v := r.Header.Get(name)
	if v == "" {
		return
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		*e = badRequest("invalid_header", "%s: %q is not a non-negative integer", name, v)
		return
	}
	*dst = n
}

// headerDuration sets *dst from header name when present; a bad value sets *e.
func headerDuration(r *http.Request, name string, dst *time.Duration, e **apiError) {
	v := r.Header.Get(name)
	if v == "" {
		return
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		*e = badRequest("invalid_header", "%s: %q is not a non-negative duration", name, v)
		return
	}
	*dst = d
}

// sleep waits d, or until ctx or done ends first; it reports whether the
// whole d passed. d == 0 returns at once; forever waits for ctx or done.
func sleep(ctx context.Context, done <-chan struct{}, d time.Duration, forever bool) bool {
	if d <= 0 && !forever {
		return true
	}
	var tick <-chan time.Time
	if !forever {
		t := time.NewTimer(d)
		defer t.Stop()
		tick = t.C
	}
	select {
	case <-tick:
		return true
	case <-ctx.Done():
	case <-done:
	}
	return false
}
