package certs

import (
	"testing"
	"time"
)

func TestDebouncerBoundsPostponement(t *testing.T) {
	d := newDebouncer(50*time.Millisecond, 300*time.Millisecond)
	defer d.stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	d.touch()
	for {
		select {
		case <-d.timer.C:
			// Without the bound, events every 10ms would keep pushing it
			// back until the deadline. (No lower bound is asserted: a
			// stalled ticker on a busy machine may let it fire early.)
			d.fired()
			if !d.pendingSince.IsZero() {
				t.Error("fired() did not clear the pending burst")
			}
			return
		case <-tick.C:
			d.touch() // a steady stream of events
		case <-deadline:
			t.Fatal("a steady stream of events postponed the check indefinitely")
		}
	}
}

func TestDebouncerWaitsForPause(t *testing.T) {
	d := newDebouncer(30*time.Millisecond, time.Hour)
	defer d.stop()
	start := time.Now()
	for range 5 {
		d.touch()
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case <-d.timer.C:
		if waited := time.Since(start); waited < 30*time.Millisecond {
			t.Errorf("fired after %v; want at least the 30ms pause", waited)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("did not fire after events stopped")
	}
}

func TestRunDevCertOnly(t *testing.T) {
	s, err := New(Config{DevCert: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	runStore(t, s) // must start and stop cleanly with nothing to watch
	if err := s.Reload(); err != nil {
		t.Errorf("Reload with only a dev certificate: %v", err)
	}
}
