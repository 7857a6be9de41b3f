package limiter

import (
	"sync"
	"time"
)

// breaker is a circuit breaker on the shared store: closed (use the store),
// open after threshold consecutive failures (do not call the store), and
// after cooldown half-open (one probe call; success closes, failure opens
// again).
type breaker struct {
	threshold int
	cooldown  time.Duration
	onChange  func(open bool)

	mu       sync.Mutex
	fails    int
	state    breakerState
	openedAt time.Time
}

type breakerState uint8

const (
	breakerClosed breakerState = iota
	breakerOpen
	breakerHalfOpen
)

// allow reports whether a call to the store may be made now; in the
// half-open state only the first caller (the probe) is allowed.
func (b *breaker) allow(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case breakerClosed:
		return true
	case breakerOpen:
		if now.Sub(b.openedAt) >= b.cooldown {
			b.state = breakerHalfOpen
			return true
		}
	}
	return false
}

func (b *breaker) success() {
	b.mu.Lock()
	was := b.state
	b.fails, b.state = 0, breakerClosed
	b.mu.Unlock()
	if was != breakerClosed && b.onChange != nil {
		b.onChange(false)
	}
}

func (b *breaker) failure(now time.Time) {
	b.mu.Lock()
	b.fails++
	opened := false
	if b.state == breakerHalfOpen || (b.state == breakerClosed && b.fails >= b.threshold) {
		opened = b.state == breakerClosed
		b.state, b.openedAt = breakerOpen, now
	}
	b.mu.Unlock()
	if opened && b.onChange != nil {
		b.onChange(true)
	}
}

// abort ends a call that neither succeeded nor failed (the caller went
// away): a half-open probe makes room for the next probe at once.
func (b *breaker) abort() {
	b.mu.Lock()
	if b.state == breakerHalfOpen {
		b.state, b.openedAt = breakerOpen, time.Time{}
	}
	b.mu.Unlock()
}

// isOpen reports whether calls are currently withheld (open or probing).
func (b *breaker) isOpen() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state != breakerClosed
}
