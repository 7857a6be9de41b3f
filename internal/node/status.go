package node

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-proxy/sluice/configs"
	"github.com/sluice-proxy/sluice/proxy"
)

// reloadStatus is what /debug/config shows about the active config and
// the last reload attempt, and the reload metrics.
type reloadStatus struct {
	mu          sync.Mutex
	loadedAt    time.Time
	tenantsAt   time.Time
	tenantsVer  string
	last        *Result
	attempts    int64
	failures    int64
	onAttempt   func(Result) // tests: called with every attempt, s.mu held
	reloads     *prometheus.CounterVec
	errorsTotal prometheus.Counter
	lastOK      prometheus.Gauge
	lastOKTime  prometheus.Gauge
	info        *prometheus.GaugeVec
	tenants     prometheus.Gauge
}

func (s *reloadStatus) register(reg prometheus.Registerer) {
	s.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_config_reloads_total", Help: "Config reload attempts by trigger and result.",
	}, []string{"trigger", "result"})
	s.errorsTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_config_reload_errors_total", Help: "Config reloads refused (invalid config, restart required, or failed to apply); the previous config kept serving.",
	})
	s.lastOK = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_config_last_reload_successful", Help: "Whether the last config reload attempt succeeded (1) or was refused (0).",
	})
	s.lastOKTime = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_config_last_reload_success_timestamp_seconds", Help: "When the active config was loaded.",
	})
	s.info = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sluice_config_info", Help: "The active config's versions (1 for the active one).",
	}, []string{"version", "tenants_version"})
	s.tenants = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_tenants", Help: "Tenants in the active config (inline and tenants file).",
	})
	reg.MustRegister(s.reloads, s.errorsTotal, s.lastOK, s.lastOKTime, s.info, s.tenants)
	s.lastOK.Set(1)
}

// loaded records that cfg became active at t.
func (s *reloadStatus) loaded(cfg *configs.Config, t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tv := tenantsVersion(cfg)
	if s.loadedAt.IsZero() || tv != s.tenantsVer {
		s.tenantsAt, s.tenantsVer = t, tv
	}
	s.loadedAt = t
	s.lastOKTime.Set(float64(t.UnixNano()) / 1e9)
	s.info.Reset()
	s.info.WithLabelValues(cfg.Version, tv).Set(1)
	s.tenants.Set(float64(len(cfg.Tenants) + len(fileTenants(cfg))))
}

func fileTenants(c *configs.Config) []proxy.TenantConfig {
	if c.FileTenants == nil {
		return nil
	}
	return c.FileTenants.Tenants
}

func (s *reloadStatus) attempted(res Result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = &res
	s.attempts++
	if s.onAttempt != nil {
		s.onAttempt(res)
	}
	s.reloads.WithLabelValues(res.Trigger, res.Result).Inc()
	if res.OK {
		s.lastOK.Set(1)
		return
	}
	s.failures++
	s.errorsTotal.Inc()
	s.lastOK.Set(0)
}

// configStatus is the JSON of GET /debug/config.
type configStatus struct {
	File     string    `json:"file"`
	Version  string    `json:"version"`
	LoadedAt time.Time `json:"loaded_at"`
	// TenantsFile describes the tenants file; nil without one.
	TenantsFile *tenantsFileStatus `json:"tenants_file,omitempty"`
	Tenants     int                `json:"tenants"`
	// LastAttempt is the last reload attempt; nil before the first.
	LastAttempt *Result `json:"last_attempt"`
	Attempts    int64   `json:"reload_attempts"`
	Failures    int64   `json:"reload_errors"`
}

type tenantsFileStatus struct {
	File     string    `json:"file"`
	Version  string    `json:"version"`
	LoadedAt time.Time `json:"loaded_at"`
	Tenants  int       `json:"tenants"`
}

func (n *Node) configStatus() configStatus {
	cfg := n.Config()
	s := &n.status
	s.mu.Lock()
	defer s.mu.Unlock()
	cs := configStatus{File: cfg.File, Version: cfg.Version, LoadedAt: s.loadedAt.UTC(),
		Tenants: len(cfg.Tenants) + len(fileTenants(cfg)), LastAttempt: s.last, Attempts: s.attempts, Failures: s.failures}
	if ft := cfg.FileTenants; ft != nil {
		cs.TenantsFile = &tenantsFileStatus{File: ft.File, Version: ft.Version, LoadedAt: s.tenantsAt.UTC(), Tenants: len(ft.Tenants)}
	}
	return cs
}
