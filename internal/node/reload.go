package node

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluice-proxy/sluice/configs"
	"github.com/sluice-proxy/sluice/proxy"
)

// Reload triggers, as reported in results, logs and the
// sluice_config_reloads_total metric; Reload and ReloadTenants take any.
const (
	TriggerSIGHUP  = "sighup"
	TriggerFile    = "file"
	TriggerAPI     = "api"
	TriggerTenants = "tenants_file"
)

// Reload outcomes (Result.Result).
const (
	ResultOK              = "ok"
	ResultUnchanged       = "unchanged"
	ResultInvalid         = "invalid"
	ResultRestartRequired = "restart_required"
	ResultFailed          = "failed"
)

// Result is the outcome of one reload attempt: the answer of
// POST /-/reload and the last attempt shown at /debug/config.
type Result struct {
	// At is when the attempt began (UTC).
	At time.Time `json:"at"`
	// Trigger is what asked for it (TriggerSIGHUP, TriggerAPI, ...).
	Trigger string `json:"trigger"`
	// Result is ok, unchanged, invalid, restart_required or failed.
	Result string `json:"result"`
	// OK is true for ok and unchanged.
	OK bool `json:"ok"`
	// Version and TenantsVersion are the active versions after the
	// attempt: the new ones when it succeeded, the old ones otherwise.
	Version        string `json:"version"`
	TenantsVersion string `json:"tenants_version,omitempty"`
	// Errors are the config's problems ("file:line:col: message").
	Errors []string `json:"errors,omitempty"`
	// RestartRequired names changed keys a running node cannot apply.
	RestartRequired []string `json:"restart_required,omitempty"`
	// Changes describe what the reload changed (see configs.Diff).
	Changes []string `json:"changes,omitempty"`
	// Warnings are problems that did not stop the reload (a certificate
	// file that failed to reload keeps its previous certificate).
	Warnings []string `json:"warnings,omitempty"`
	// DurationMS is how long the attempt took, in milliseconds.
	DurationMS float64 `json:"duration_ms"`
}

// errClosing refuses reloads once the node drains.
var errClosing = errors.New("the node is shutting down")

// Reload reads the config file (and its tenants file) again and, if it is
// valid and changes nothing that needs a restart, swaps it in: new
// requests use the new routes, pools, tenants and limits; running ones
// finish on what they started with. Certificates are re-read in any case.
// A bad config changes nothing: the old one keeps serving.
func (n *Node) Reload(trigger string) Result {
	n.mu.Lock()
	defer n.mu.Unlock()
	start := time.Now()
	cur := n.Config()
	res := Result{At: start.UTC(), Trigger: trigger}
	if n.closing {
		res.Result, res.Errors = ResultFailed, []string{errClosing.Error()}
		return n.finishReload(res, start)
	}
	next, err := n.loadNext(cur)
	switch {
	case err != nil:
		res.Result, res.Errors = ResultInvalid, errorTexts(err)
	default:
		n.applyNext(cur, next, &res)
	}
	// Certificates are re-read whatever became of the config: they have
	// their own files, and a pair that fails keeps its previous certificate.
	if n.certs != nil {
		if err := n.certs.Reload(); err != nil {
			res.Warnings = append(res.Warnings, "certificates: "+err.Error())
		}
	}
	return n.finishReload(res, start)
}

// errorTexts lists a config error's problems as "file:line:col: message".
func errorTexts(err error) []string {
	var out []string
	for _, e := range configs.Errors(err) {
		out = append(out, e.Error())
	}
	return out
}

// loadNext reads the config file again. The embedded default cannot change.
func (n *Node) loadNext(cur *configs.Config) (*configs.Config, error) {
	if cur.File == configs.DefaultName {
		return cur, nil
	}
	return configs.Load(cur.File)
}

// applyNext checks next against cur and swaps it in when it can be.
func (n *Node) applyNext(cur, next *configs.Config, res *Result) {
	d := configs.Compare(cur, next)
	switch {
	case len(d.RestartRequired) > 0:
		res.Result, res.RestartRequired = ResultRestartRequired, d.RestartRequired
		res.Changes = capLines(d.Lines())
	case d.Empty():
		res.Result, res.OK = ResultUnchanged, true
		if cur.Version != next.Version || tenantsVersion(cur) != tenantsVersion(next) {
			n.cfg.Store(next) // comments or layout only: show the file as it is now
			n.status.loaded(next, time.Now())
		}
	default:
		if err := n.apply(next); err != nil {
			res.Result, res.Errors = ResultFailed, []string{err.Error()}
			return
		}
		res.Result, res.OK, res.Changes = ResultOK, true, capLines(d.Lines())
	}
}

// maxChangeLines bounds the changes a reload reports and logs (a tenants
// file may change 100,000 tenants at once).
const maxChangeLines = 100

func capLines(lines []string) []string {
	if len(lines) <= maxChangeLines {
		return lines
	}
	more := len(lines) - maxChangeLines
	return append(lines[:maxChangeLines:maxChangeLines], fmt.Sprintf("… and %d more (sluice check -diff lists them all)", more))
}

// apply builds next's state and swaps it in. Simulators and pools whose
// config is unchanged are kept; replaced ones are stopped once every
// request that could use them has finished. n.mu is held.
func (n *Node) apply(next *configs.Config) error {
	sims, err := n.simulatorsFor(next)
	started := newSims(n.sims, sims)
	if err == nil {
		var st *proxy.State
		var pools poolSet
		if st, pools, err = buildState(next, simURLs(sims), n.pools); err == nil {
			n.swapIn(st, next, sims, pools)
			return nil
		}
	}
	for _, s := range started {
		s.stop()
	}
	return err
}

// newSims lists the simulators in next that are not in cur.
func newSims(cur, next map[string]*simServer) []*simServer {
	var out []*simServer
	for name, s := range next {
		if cur[name] != s {
			out = append(out, s)
		}
	}
	return out
}

// swapIn makes st the handler's state and retires what only the old
// state held. n.mu is held.
func (n *Node) swapIn(st *proxy.State, next *configs.Config, sims map[string]*simServer, pools poolSet) {
	st.Limiter = n.limiter
	pools.start(n.bgCtx, n.pools)
	var oldSims []*simServer
	for name, s := range n.sims {
		if sims[name] != s {
			oldSims = append(oldSims, s)
		}
	}
	n.retire(n.handler.Swap(st), n.pools, pools, oldSims)
	n.sims, n.pools = sims, pools
	n.cfg.Store(next)
	n.status.loaded(next, time.Now())
}

// retire stops the pools of old that are not in cur, and sims, once every
// replaced state has been released by its requests (a pool may be shared
// by several replaced states; waiting for all of them is simple and safe).
// n.mu is held.
func (n *Node) retire(prev <-chan struct{}, old, cur poolSet, sims []*simServer) {
	waits := n.draining[:0]
	for _, w := range n.draining {
		select {
		case <-w:
		default:
			waits = append(waits, w)
		}
	}
	n.draining = append(waits, prev)
	retired := 0
	for name, p := range old.pools {
		if cur.pools[name] != p {
			retired++
		}
	}
	if retired == 0 && len(sims) == 0 {
		return
	}
	waitFor := append([]<-chan struct{}(nil), n.draining...)
	n.workers.Add(1)
	go func() {
		defer n.workers.Done()
		for _, w := range waitFor {
			select {
			case <-w:
			case <-n.bgCtx.Done():
			}
		}
		old.close(cur)
		for _, s := range sims {
			s.stop()
		}
	}()
}

// ReloadTenants reads the tenants file again and swaps in the new tenants
// alone: routes, pools and limiter stay as they are. A revoked key fails
// from the next request on.
func (n *Node) ReloadTenants(trigger string) Result {
	n.mu.Lock()
	defer n.mu.Unlock()
	start := time.Now()
	cur := n.Config()
	res := Result{At: start.UTC(), Trigger: trigger}
	if n.closing {
		res.Result, res.Errors = ResultFailed, []string{errClosing.Error()}
		return n.finishReload(res, start)
	}
	next, err := n.loadTenants(cur)
	if err != nil {
		res.Result, res.Errors = ResultInvalid, errorTexts(err)
		return n.finishReload(res, start)
	}
	d := configs.Compare(cur, next)
	res.Result, res.OK, res.Changes = ResultUnchanged, true, capLines(d.Lines())
	if !d.Empty() {
		res.Result = ResultOK
		st := *n.handler.State()
		st.Tenants = proxy.NewTenants(next.AllTenants())
		n.retire(n.handler.Swap(&st), n.pools, n.pools, nil)
	}
	if tenantsVersion(next) != tenantsVersion(cur) {
		n.cfg.Store(next)
		n.status.loaded(next, time.Now())
	}
	return n.finishReload(res, start)
}

func (n *Node) loadTenants(cur *configs.Config) (*configs.Config, error) {
	if cur.TenantsFile == "" {
		return nil, errors.New("the config names no tenants_file")
	}
	set, err := configs.LoadTenants(cur.TenantsPath())
	if err != nil {
		return nil, err
	}
	return cur.WithTenants(set)
}

// finishReload records, counts and logs an attempt.
func (n *Node) finishReload(res Result, start time.Time) Result {
	active := n.Config()
	res.Version, res.TenantsVersion = active.Version, tenantsVersion(active)
	res.DurationMS = float64(time.Since(start).Microseconds()) / 1000
	n.status.attempted(res)
	attrs := []any{"trigger", res.Trigger, "result", res.Result, "version", res.Version, "duration_ms", res.DurationMS}
	switch {
	case !res.OK:
		attrs = append(attrs, "errors", res.Errors, "restart_required", res.RestartRequired)
		n.log.Error("config reload refused; the previous config keeps serving", attrs...)
	case res.Result == ResultOK:
		n.log.Info("config reloaded", append(attrs, "changes", res.Changes)...)
	default:
		n.log.Debug("config reload: nothing changed", attrs...)
	}
	for _, w := range res.Warnings {
		n.log.Warn("config reload", "warning", w)
	}
	return res
}

func tenantsVersion(c *configs.Config) string {
	if c.FileTenants == nil {
		return ""
	}
	return c.FileTenants.Version
}
