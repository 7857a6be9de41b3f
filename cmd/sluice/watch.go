package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/sluice-proxy/sluice/configs"
)

// Debouncing of file events: a check runs once events pause for
// watchQuiet, and at the latest watchMaxWait after the first of a burst.
const (
	watchQuiet   = 200 * time.Millisecond
	watchMaxWait = 2 * time.Second
)

// startWatcher reloads the config when its file, or its tenants file,
// changes. It watches the files' directories, not the files: editors
// save by renaming a new file over the old one and Kubernetes swaps a
// symlink, neither of which a watch on the file itself sees. After events
// pause it compares the files' content with what it last saw, so unrelated
// events in the directories do nothing and a broken file is tried once. A
// change of the config file reloads everything; a change of the tenants
// file alone reloads only the tenants. The watcher stops with the node.
func (n *node) startWatcher() error {
	cfg := n.config()
	if cfg.File == configs.DefaultName {
		return nil
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching the config: %w", err)
	}
	fw := &fileWatcher{n: n, w: w, dirs: map[string]bool{}, cfgSeen: cfg.Version, tenantsSeen: tenantsVersion(cfg)}
	if err := fw.rewatch(); err != nil {
		w.Close()
		return err
	}
	n.workers.Add(1)
	go fw.loop()
	return nil
}

type fileWatcher struct {
	n    *node
	w    *fsnotify.Watcher
	dirs map[string]bool
	// cfgSeen and tenantsSeen are the versions of the files' content last
	// looked at (loaded or refused).
	cfgSeen, tenantsSeen string
}

// loop is the watcher's event loop; it exits when the node closes.
func (fw *fileWatcher) loop() {
	defer fw.n.workers.Done()
	defer fw.w.Close()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var first time.Time // of the pending burst; zero when none
	touch := func() {
		now := time.Now()
		if first.IsZero() {
			first = now
		}
		timer.Reset(min(watchQuiet, max(0, first.Add(watchMaxWait).Sub(now))))
	}
	for {
		select {
		case <-fw.n.bgCtx.Done():
			timer.Stop()
			return
		case ev, ok := <-fw.w.Events:
			if !ok {
				return
			}
			if ev.Op != fsnotify.Chmod {
				touch()
			}
		case err, ok := <-fw.w.Errors:
			if !ok {
				return
			}
			fw.n.log.Warn("config watcher error; checking the files", "err", err)
			touch()
		case <-timer.C:
			first = time.Time{}
			fw.check()
			if err := fw.rewatch(); err != nil {
				fw.n.log.Warn("config watcher", "err", err)
			}
		}
	}
}

// check reloads what changed since it was last looked at.
func (fw *fileWatcher) check() {
	cfg := fw.n.config()
	if v, ok := fileVersion(cfg.File); ok && v != fw.cfgSeen {
		fw.cfgSeen = v
		if v != cfg.Version {
			fw.n.reload(triggerFile)
			cfg = fw.n.config()
			fw.tenantsSeen = tenantsVersion(cfg)
		}
	}
	if cfg.TenantsFile == "" {
		return
	}
	if v, ok := fileVersion(cfg.TenantsPath()); ok && v != fw.tenantsSeen {
		fw.tenantsSeen = v
		if v != tenantsVersion(cfg) {
			fw.n.reloadTenants(triggerTenants)
		}
	}
}

// fileVersion is the version of a file's content; false while it cannot be
// read (between an editor's delete and create, say).
func fileVersion(path string) (string, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", false
	}
	return configs.Version(data), true
}

// rewatch watches the directories of the active config's files.
func (fw *fileWatcher) rewatch() error {
	cfg := fw.n.config()
	want := map[string]bool{filepath.Dir(cfg.File): true}
	if p := cfg.TenantsPath(); p != "" {
		want[filepath.Dir(p)] = true
	}
	for d := range fw.dirs {
		if !want[d] {
			fw.w.Remove(d)
			delete(fw.dirs, d)
		}
	}
	for d := range want {
		if fw.dirs[d] {
			continue
		}
		if err := fw.w.Add(d); err != nil {
			return fmt.Errorf("watching %s: %w", d, err)
		}
		fw.dirs[d] = true
	}
	return nil
}
