package certs

import (
	"path/filepath"
	"slices"
	"time"
)

// WatchDirs lists the directories holding the certificate files, and the
// directories of their symlink targets, without duplicates: the ones a
// file watcher must watch to see atomic renames and Kubernetes-style
// "..data" symlink swaps. It is empty with only a development certificate.
func (s *Store) WatchDirs() []string {
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

// PollInterval is how often a file watcher should call Check in case file
// system events were missed (Config.PollInterval with its default); zero
// or negative means never.
func (s *Store) PollInterval() time.Duration { return s.poll }
