package node

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"

	"github.com/sluice-proxy/sluice/configs"
	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/proxy/observe"
)

// adminRoutes adds the config endpoints to the admin listener:
//
//	POST /-/reload       reload the config now; JSON Result
//	GET  /debug/config   the active config's version, load time and the last reload attempt (JSON);
//	                     ?format=yaml the active config's text (secrets redacted),
//	                     ?format=tenants the active tenants file's text (comments removed)
//	GET  /debug/regions  this region's share of every tenant's global limits and the
//	                     global use (JSON; 404 on a single-region node)
func (n *Node) adminRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /debug/regions", func(w http.ResponseWriter, r *http.Request) {
		rg, ok := n.limiter.(*limiter.Region)
		if !ok {
			http.Error(w, "single-region node: no region.global_store is configured", http.StatusNotFound)
			return
		}
		writeJSON(w, http.StatusOK, rg.Report())
	})
	mux.HandleFunc("POST /-/reload", func(w http.ResponseWriter, r *http.Request) {
		res := n.Reload(TriggerAPI)
		writeJSON(w, reloadStatusCode(res), res)
	})
	mux.HandleFunc("GET /debug/config", func(w http.ResponseWriter, r *http.Request) {
		cfg := n.Config()
		switch r.URL.Query().Get("format") {
		case "", "json":
			writeJSON(w, http.StatusOK, n.configStatus())
		case "yaml":
			w.Header().Set("Content-Type", "application/yaml; charset=utf-8")
			w.Header().Set("X-Sluice-Config-Version", cfg.Version)
			w.Write(cfg.RedactedText())
		case "tenants":
			if cfg.FileTenants == nil {
				http.Error(w, "the active config has no tenants_file", http.StatusNotFound)
				return
			}
			w.Header().Set("Content-Type", "application/yaml; charset=utf-8")
			w.Header().Set("X-Sluice-Config-Version", cfg.FileTenants.Version)
			w.Write(cfg.FileTenants.RedactedText())
		default:
			http.Error(w, "format must be json, yaml or tenants", http.StatusBadRequest)
		}
	})
}

// guardAdmin puts the admin routes behind observe.AdminGuard, with the
// active config's token file and host names (a reload changes both). It
// fails when admin.token_file is set but holds no readable token.
func (n *Node) guardAdmin(h http.Handler, cfg *configs.Config) (http.Handler, error) {
	if _, err := cfg.AdminToken(); err != nil {
		return nil, err
	}
	g := observe.AdminGuard{
		Hosts: func() []string { return n.Config().Admin.Hosts },
		Token: func() (string, error) { return n.Config().AdminToken() },
	}
	if cfg.AdminExposed() {
		n.log.Warn("the admin listener binds a non-loopback address with no admin.token_file: anyone who reaches it can reload the config and read /debug",
			"addr", cfg.Listeners.Admin)
	}
	return g.Wrap(h), nil
}

// reloadStatusCode is the HTTP status of POST /-/reload for a result.
func reloadStatusCode(res Result) int {
	switch res.Result {
	case ResultOK, ResultUnchanged:
		return http.StatusOK
	case ResultInvalid:
		return http.StatusUnprocessableEntity
	case ResultRestartRequired:
		return http.StatusConflict
	}
	return http.StatusServiceUnavailable
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// EnablePprof adds Go's profiler to the admin listener (sluice serve
// -pprof). It is off by default: a CPU profile costs the node while it
// runs, and the admin listener should stay loopback-only when it is on.
// Example: go tool pprof http://127.0.0.1:9090/debug/pprof/profile?seconds=20
func (n *Node) EnablePprof() {
	n.admin.HandleFunc("GET /debug/pprof/", pprof.Index)
	n.admin.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	n.admin.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	n.admin.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	n.admin.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
}
