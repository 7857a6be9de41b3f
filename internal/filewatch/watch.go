package filewatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Defaults of Config.Quiet and Config.MaxWait.
const (
	DefaultQuiet   = 200 * time.Millisecond
	DefaultMaxWait = 2 * time.Second
)

// ErrRunning is returned by Run while another Run of the same Watcher is active.
var ErrRunning = errors.New("filewatch: already running")

// Config describes what a Watcher watches and what it calls.
type Config struct {
	// Dirs returns the directories to watch. It is called by New, by
	// Rewatch and after every Check, so that new symlink targets and
	// directories removed and created again are picked up. Required.
	Dirs func() []string
	// Check is called once events pause (polled false) and every Poll
	// (polled true), from Run's goroutine only. Required.
	Check func(polled bool)
	// Quiet is how long events must pause before Check runs. Zero means
	// DefaultQuiet.
	Quiet time.Duration
	// MaxWait bounds how long a steady stream of events (say, a busy log
	// file in the same directory) can postpone Check, counted from the
	// first event of a burst. Zero means DefaultMaxWait.
	MaxWait time.Duration
	// Poll, if positive, also calls Check this often, in case events were
	// missed. Zero or negative: events only.
	Poll time.Duration
	// NoEvents disables file system events: only Poll calls Check (for
	// file systems without inotify, such as some network mounts).
	NoEvents bool
	// Log receives the watcher's warnings. Nil means slog.Default().
	Log *slog.Logger
}

// Watcher watches directories and calls Config.Check after changes. Its
// methods are safe for simultaneous use by multiple goroutines.
type Watcher struct {
	cfg     Config
	fs      *fsnotify.Watcher // nil: events unavailable, polling only
	mu      sync.Mutex        // serialises Rewatch
	running atomic.Bool
}

// New starts watching cfg.Dirs(). If file system events are unavailable it
// logs a warning and the Watcher relies on Poll (see Events). Directories
// that cannot be watched are logged and retried after every Check. Call
// Run to receive the events, then Close.
func New(cfg Config) *Watcher {
	if cfg.Quiet <= 0 {
		cfg.Quiet = DefaultQuiet
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	w := &Watcher{cfg: cfg}
	if cfg.NoEvents {
		return w
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		cfg.Log.Warn("file watcher unavailable; changes are noticed by polling only", "err", err)
		return w
	}
	w.fs = fw
	if err := w.Rewatch(); err != nil {
		cfg.Log.Warn("file watcher", "err", err)
	}
	return w
}

// Events reports whether file system events are being received; false
// means only Poll (if set) notices changes.
func (w *Watcher) Events() bool { return w.fs != nil }

// Rewatch makes the watcher watch exactly Config.Dirs() now: it adds the
// directories not watched and drops the ones no longer listed. It returns
// the directories that could not be added.
func (w *Watcher) Rewatch() error {
	if w.fs == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	dirs := w.cfg.Dirs()
	have := w.fs.WatchList()
	for _, d := range have {
		if !slices.Contains(dirs, d) {
			_ = w.fs.Remove(d)
		}
	}
	var errs []error
	for _, d := range dirs {
		if slices.Contains(have, d) {
			continue
		}
		if err := w.fs.Add(d); err != nil {
			errs = append(errs, fmt.Errorf("watching %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// Run calls Check after changes until ctx is done; it then returns nil.
// It returns ErrRunning if the Watcher is already running.
func (w *Watcher) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer w.running.Store(false)
	var events <-chan fsnotify.Event
	var errs <-chan error
	if w.fs != nil {
		events, errs = w.fs.Events, w.fs.Errors
	}
	var pollC <-chan time.Time
	if w.cfg.Poll > 0 {
		poll := time.NewTicker(w.cfg.Poll)
		defer poll.Stop()
		pollC = poll.C
	}
	d := newDebouncer(w.cfg.Quiet, w.cfg.MaxWait)
	defer d.stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				events = nil
			} else if ev.Op != fsnotify.Chmod {
				d.touch()
			}
		case err, ok := <-errs:
			if !ok {
				errs = nil
			} else {
				w.cfg.Log.Warn("file watcher error; checking the files", "err", err)
				d.touch()
			}
		case <-d.timer.C:
			d.fired()
			w.check(false)
		case <-pollC:
			w.check(true)
		}
	}
}

// check calls Check, then watches the directories as they are now.
func (w *Watcher) check(polled bool) {
	w.cfg.Check(polled)
	if err := w.Rewatch(); err != nil {
		w.cfg.Log.Debug("file watcher", "err", err)
	}
}

// Close releases the file system watcher. Call it after Run has returned.
func (w *Watcher) Close() error {
	if w.fs == nil {
		return nil
	}
	return w.fs.Close()
}

// debouncer fires its timer once events have paused for delay, or at the
// latest max after the first event of a burst.
type debouncer struct {
	timer        *time.Timer
	delay, max   time.Duration
	pendingSince time.Time
}

func newDebouncer(delay, max time.Duration) *debouncer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &debouncer{timer: t, delay: delay, max: max}
}

func (d *debouncer) touch() {
	now := time.Now()
	if d.pendingSince.IsZero() {
		d.pendingSince = now
	} else if now.Sub(d.pendingSince) >= d.max {
		return // let the pending timer fire
	}
	d.timer.Reset(d.delay)
}

func (d *debouncer) fired() { d.pendingSince = time.Time{} }

func (d *debouncer) stop() { d.timer.Stop() }
