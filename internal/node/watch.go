package node

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"

	"github.com/sluice-proxy/sluice/configs"
	"github.com/sluice-proxy/sluice/internal/filewatch"
)

// fileWatcher is the node's one file watcher (see internal/filewatch): it
// watches the directories of the certificate files from the start, and
// those of the config file and its tenants file once WatchConfig is
// called; after events pause it compares the files' content with what it
// last saw, so unrelated events in the directories do nothing and a broken
// file is tried once. A change of the config file reloads everything; a
// change of the tenants file alone reloads only the tenants; a changed
// certificate pair is swapped in. Certificates are also polled every
// poll_interval in case events were missed. It stops with the node.
type fileWatcher struct {
	n *Node
	w *filewatch.Watcher

	mu       sync.Mutex // guards the fields below
	configOn bool       // watch the config and tenants files
	// cfgSeen and tenantsSeen are the versions of the files' content last
	// looked at (loaded or refused).
	cfgSeen, tenantsSeen string
}

// startWatcher starts the node's file watcher; Close stops it.
func (n *Node) startWatcher() {
	fw := &fileWatcher{n: n}
	cfg := filewatch.Config{Dirs: fw.dirs, Check: fw.check, Log: n.log}
	if n.certs != nil {
		cfg.Poll = n.certs.PollInterval()
	}
	fw.w = filewatch.New(cfg)
	n.watch = fw
	n.workers.Add(1)
	go fw.run()
}

// run is the watcher's goroutine; it exits when the node closes.
func (fw *fileWatcher) run() {
	defer fw.n.workers.Done()
	defer fw.w.Close()
	_ = fw.w.Run(fw.n.bgCtx) // ErrRunning only, and nothing else runs it
}

// WatchConfig makes the node reload its config when the config file, or
// its tenants file, changes. Editors that rename a new file over the old
// one and Kubernetes' symlink swaps are seen (the directories are watched,
// not the files). It does nothing for the embedded default, and returns an
// error when changes cannot be noticed (reload with Reload then).
func (n *Node) WatchConfig() error {
	cfg := n.Config()
	if cfg.File == configs.DefaultName {
		return nil
	}
	fw := n.watch
	if !fw.w.Events() {
		return errors.New("watching the config: file system events are unavailable")
	}
	fw.mu.Lock()
	fw.configOn, fw.cfgSeen, fw.tenantsSeen = true, cfg.Version, tenantsVersion(cfg)
	fw.mu.Unlock()
	if err := fw.w.Rewatch(); err != nil {
		return fmt.Errorf("watching the config: %w", err)
	}
	return nil
}

// dirs lists the directories to watch: the config's and the tenants
// file's (once WatchConfig was called), and the certificates'.
func (fw *fileWatcher) dirs() []string {
	fw.mu.Lock()
	on := fw.configOn
	fw.mu.Unlock()
	var dirs []string
	if on {
		cfg := fw.n.Config()
		dirs = appendDir(dirs, cfg.File)
		if p := cfg.TenantsPath(); p != "" {
			dirs = appendDir(dirs, p)
		}
	}
	if fw.n.certs != nil {
		dirs = append(dirs, fw.n.certs.WatchDirs()...)
	}
	slices.Sort(dirs)
	return slices.Compact(dirs)
}

func appendDir(dirs []string, file string) []string {
	if abs, err := filepath.Abs(file); err == nil {
		return append(dirs, filepath.Dir(abs))
	}
	return append(dirs, filepath.Dir(file))
}

// check reloads what changed: the config and tenants files after events
// only (polled false), the certificates in any case.
func (fw *fileWatcher) check(polled bool) {
	if !polled {
		fw.checkConfig()
	}
	if c := fw.n.certs; c != nil {
		_ = c.Check() // failures are logged and counted by the store
	}
}

// checkConfig reloads the config or the tenants if their files changed
// since they were last looked at.
func (fw *fileWatcher) checkConfig() {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if !fw.configOn {
		return
	}
	cfg := fw.n.Config()
	if v, ok := fileVersion(cfg.File); ok && v != fw.cfgSeen {
		fw.cfgSeen = v
		if v != cfg.Version {
			fw.n.Reload(TriggerFile)
			cfg = fw.n.Config()
			fw.tenantsSeen = tenantsVersion(cfg)
		}
	}
	if cfg.TenantsFile == "" {
		return
	}
	if v, ok := fileVersion(cfg.TenantsPath()); ok && v != fw.tenantsSeen {
		fw.tenantsSeen = v
		if v != tenantsVersion(cfg) {
			fw.n.ReloadTenants(TriggerTenants)
		}
	}
}

// fileVersion is the version of a file's content; false while it cannot be
// read (between an editor's delete and create, say).
func fileVersion(path string) (string, bool) {
	data, err := configs.ReadFile(path) // at most MaxFileBytes+1: a huge file costs no more
	if err != nil {
		return "", false
	}
	return configs.Version(data), true
}
