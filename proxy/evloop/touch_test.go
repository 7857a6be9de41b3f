package evloop

import (
	"testing"

	"golang.org/x/sys/unix"
)

// touchRelay counts its Touch calls.
type touchRelay struct {
	chunkRelay
	touched int
}

func (r *touchRelay) Touch() int { r.touched++; return 0 }

// TestTouchOnlyLiveBackendEvents: the batch's pre-pass (loop.touch) asks a
// Toucher Relay to read its state for a ready backend socket of a stream
// not yet ending, and never for its client's socket, for an ending stream
// (its End has run: the proxy's completion owns the exchange then) or for
// a descriptor no stream has.
func TestTouchOnlyLiveBackendEvents(t *testing.T) {
	l, err := newLoop(nil, Options{ReadBuffer: 4 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(l.epfd)
	defer unix.Close(l.efd)
	live, ending := &touchRelay{}, &touchRelay{}
	a := &stream{cfd: 10, ufd: 11, relay: live}
	b := &stream{cfd: 12, ufd: 13, relay: ending, ending: true}
	l.byFD = make([]*stream, 14)
	l.byFD[10], l.byFD[11], l.byFD[12], l.byFD[13] = a, a, b, b
	for i, fd := range []int32{11, 10, 13, 12, 99, 11} {
		l.ready[i] = unix.EpollEvent{Events: unix.EPOLLIN, Fd: fd}
	}
	l.touch(6)
	if live.touched != 2 {
		t.Errorf("live stream touched %d times, want 2 (its two backend events)", live.touched)
	}
	if ending.touched != 0 {
		t.Errorf("ending stream touched %d times, want 0", ending.touched)
	}
}
