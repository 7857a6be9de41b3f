package certs

import (
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Run reloads certificates when their files change, until ctx is done; it
// then returns nil. It watches the parent directories of the files (and of
// their symlink targets) so that atomic renames and Kubernetes-style
// "..data" symlink swaps are seen, debounces events by ~150ms, and re-reads
// the files every Config.PollInterval in case events were missed. If file
// system events are unavailable it logs a warning and relies on polling.
// Run returns ErrRunning if the Store is already running.
func (s *Store) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer s.running.Store(false)
	dirs := s.watchDirs()
	var w *fsnotify.Watcher
	if len(dirs) > 0 {
		w = s.newWatcher(dirs)
	}
	if w != nil {
		defer w.Close()
	}
	if s.watching != nil {
		s.watching()
	}
	if len(dirs) == 0 {
		<-ctx.Done() // development certificate only: nothing to watch
		return nil
	}
	s.loop(ctx, w)
	return nil
}

// loop is Run's event loop; it exits when ctx is done.
func (s *Store) loop(ctx context.Context, w *fsnotify.Watcher) {
	var events <-chan fsnotify.Event
	var errs <-chan error
	if w != nil {
		events, errs = w.Events, w.Errors
	}
	var pollC <-chan time.Time
	if s.poll > 0 {
		poll := time.NewTicker(s.poll)
		defer poll.Stop()
		pollC = poll.C
	}
	d := newDebouncer(s.debounce, maxDebounce)
	defer d.stop()
	for {
		select {
		case <-ctx.Done():
			return
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
				s.log.Warn("tls certificate watcher error; checking files", "err", err)
				d.touch()
			}
		case <-d.timer.C:
			d.fired()
			_ = s.check(false) // failures are logged and counted by check
		case <-pollC:
			s.rewatch(w, s.watchDirs(), slog.LevelDebug)
			_ = s.check(false)
		}
	}
}

// maxDebounce bounds how long a steady stream of events (say, a busy log
// file in the same directory) can postpone a check.
const maxDebounce = time.Second

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

// watchDirs lists the directories holding the files, and the directories
// of their symlink targets, without duplicates.
func (s *Store) watchDirs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var dirs []string
	add := func(file string) {
		if abs, err := filepath.Abs(file); err == nil {
			dirs = append(dirs, filepath.Dir(abs))
		}
		if real, err := filepath.EvalSymlinks(file); err == nil {
			if abs, err := filepath.Abs(real); err == nil {
				dirs = append(dirs, filepath.Dir(abs))
			}
		}
	}
	for _, e := range s.entries {
		if !e.dev {
			add(e.pair.CertFile)
			add(e.pair.KeyFile)
		}
	}
	slices.Sort(dirs)
	return slices.Compact(dirs)
}

// newWatcher starts an fsnotify watcher on dirs, or returns nil (after
// logging why) when that is not possible; polling still works then.
func (s *Store) newWatcher(dirs []string) *fsnotify.Watcher {
	if s.noWatch {
		return nil
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		s.log.Warn("tls certificate watcher unavailable; polling only", "err", err)
		return nil
	}
	s.rewatch(w, dirs, slog.LevelWarn)
	return w
}

// rewatch makes w watch exactly dirs: it adds directories not watched (new
// symlink targets, or directories removed and created again) and drops
// ones no longer needed, logging failures at level.
func (s *Store) rewatch(w *fsnotify.Watcher, dirs []string, level slog.Level) {
	if w == nil {
		return
	}
	have := w.WatchList()
	for _, d := range have {
		if !slices.Contains(dirs, d) {
			_ = w.Remove(d)
		}
	}
	for _, d := range dirs {
		if slices.Contains(have, d) {
			continue
		}
		if err := w.Add(d); err != nil {
			s.log.Log(context.Background(), level,
				"tls certificate directory not watched; polling covers it", "dir", d, "err", err)
		}
	}
}
