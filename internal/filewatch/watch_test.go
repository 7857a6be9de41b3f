package filewatch

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"
)

func TestDebouncerBoundsPostponement(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
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
				// back until the deadline.
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
	})
}

func TestDebouncerWaitsForPause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDebouncer(30*time.Millisecond, time.Hour)
		defer d.stop()
		start := time.Now()
		for range 5 {
			d.touch()
			time.Sleep(5 * time.Millisecond) // the bubble's clock: events 5ms apart
		}
		select {
		case <-d.timer.C:
			if waited := time.Since(start); waited < 30*time.Millisecond {
				t.Errorf("fired after %v; want at least the 30ms pause", waited)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("did not fire after events stopped")
		}
	})
}

// A file renamed over another in a watched directory makes one Check run;
// a second Run of the same Watcher is refused.
func TestWatcherSeesRename(t *testing.T) {
	dir := t.TempDir()
	checks := make(chan bool, 16)
	w := New(Config{Dirs: func() []string { return []string{dir} }, Check: func(polled bool) { checks <- polled }, Quiet: 10 * time.Millisecond})
	if !w.Events() {
		t.Skip("no file system events here")
	}
	runWatcher(t, w)
	tmp := filepath.Join(dir, ".f.tmp")
	if err := os.WriteFile(tmp, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "f")); err != nil {
		t.Fatal(err)
	}
	select {
	case polled := <-checks:
		if polled {
			t.Fatal("Check called as a poll; want after an event")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no Check after a rename in the watched directory")
	}
	if !w.running.Load() {
		t.Fatal("the watcher is not running after calling Check")
	}
	if err := w.Run(t.Context()); !errors.Is(err, ErrRunning) {
		t.Errorf("second Run: got %v; want ErrRunning", err)
	}
}

func TestWatcherPolls(t *testing.T) {
	checks := make(chan bool, 16)
	w := New(Config{Dirs: func() []string { return nil }, Check: func(polled bool) { checks <- polled }, Poll: 10 * time.Millisecond, NoEvents: true})
	if w.Events() {
		t.Fatal("Events() with NoEvents set")
	}
	runWatcher(t, w)
	select {
	case polled := <-checks:
		if !polled {
			t.Fatal("Check not marked as a poll")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no poll")
	}
}

// runWatcher runs w until the test ends, then closes it.
func runWatcher(t *testing.T, w *Watcher) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		w.Close()
	})
}
