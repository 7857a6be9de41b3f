package proxy

import (
	"sync"
	"sync/atomic"

	"github.com/sluice-proxy/sluice/limiter"
)

// liveState is a State as served: the requests using it are counted, so
// that a replaced State's own resources are stopped only after they end.
type liveState struct {
	st      *State
	refs    atomic.Int64
	retired atomic.Bool
	once    sync.Once
	done    chan struct{}
}

func newLiveState(st *State) *liveState {
	return &liveState{st: st, done: make(chan struct{})}
}

// acquire returns the current state, counted as used by one more request.
// The count is taken before the state is known to be current, so a state
// whose count reaches zero after it was replaced is never picked up again.
func (h *Handler) acquire() *liveState {
	for {
		l := h.live.Load()
		l.refs.Add(1)
		if h.live.Load() == l {
			return l
		}
		l.release() // replaced meanwhile: use the new one
	}
}

// release ends one request's use of the state.
func (l *liveState) release() {
	if l.refs.Add(-1) == 0 && l.retired.Load() {
		l.once.Do(func() { close(l.done) })
	}
}

// retire marks a replaced state; its channel closes when no request uses
// it.
func (l *liveState) retire() <-chan struct{} {
	l.retired.Store(true)
	if l.refs.Load() == 0 {
		l.once.Do(func() { close(l.done) })
	}
	return l.done
}

// shadowed returns l with enforcement off, in the per-model overrides too:
// a route in shadow mode reports its tenants' limits but never refuses.
func shadowed(l limiter.Limits) limiter.Limits {
	off := false
	l.Enforce = &off
	if len(l.Models) > 0 {
		m := make(map[string]limiter.Limits, len(l.Models))
		for name, o := range l.Models {
			o.Enforce = &off
			m[name] = o
		}
		l.Models = m
	}
	return l
}
