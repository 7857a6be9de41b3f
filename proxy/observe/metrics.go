package observe

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the pipeline's Prometheus metrics. A nil *Metrics records
// nothing. Latencies are observed once a request has finished, so the
// per-token path does no metric work.
type Metrics struct {
	requests *prometheus.CounterVec
	inflight prometheus.Gauge
	retries  *prometheus.CounterVec
	hedges   *prometheus.CounterVec
	refusals *prometheus.CounterVec
	ttft     *prometheus.HistogramVec
	itl      *prometheus.HistogramVec
	e2e      *prometheus.HistogramVec
	stages   *prometheus.HistogramVec
	tokens   *prometheus.CounterVec
	wsConns  *prometheus.GaugeVec
	wsSlow   prometheus.Counter

	tenantCap int
	mu        sync.Mutex
	tenants   map[string]bool

	// Series looked up once and kept, so that recording a request does
	// not hash its label values again: *routeObs by routeKey,
	// prometheus.Counter by requestKey, *backendObs by backendKey,
	// *tokenObs by tokenKey. Their cardinality is the metrics' own.
	byRoute, byRequest, byBackend, byTokens sync.Map
}

type (
	routeKey   struct{ route, proto string }
	requestKey struct {
		route, proto, tenant string
		code                 int
	}
	backendKey struct{ route, pool, backend, proto string }
	tokenKey   struct{ route, tenant string }
)

// routeObs are a (route, proto)'s duration series: e2e, and each stage in
// the order of Timed.
type routeObs struct {
	e2e    prometheus.Observer
	stages [len(Timed)]prometheus.Observer
}

type backendObs struct{ ttft, itl prometheus.Observer }

type tokenObs struct{ in, out prometheus.Counter }

// cachedSeries returns the series kept in cache under k, making it with mk the
// first time.
func cachedSeries[K comparable, V any](cache *sync.Map, k K, mk func() V) V {
	if v, ok := cache.Load(k); ok {
		return v.(V)
	}
	v, _ := cache.LoadOrStore(k, mk())
	return v.(V)
}

func (m *Metrics) routeObs(route, proto string) *routeObs {
	return cachedSeries(&m.byRoute, routeKey{route, proto}, func() *routeObs {
		o := &routeObs{e2e: m.e2e.WithLabelValues(route, proto)}
		for i, s := range Timed {
			o.stages[i] = m.stages.WithLabelValues(route, proto, s)
		}
		return o
	})
}

func (m *Metrics) requestCounter(route, proto, tenant string, code int) prometheus.Counter {
	return cachedSeries(&m.byRequest, requestKey{route, proto, tenant, code}, func() prometheus.Counter {
		return m.requests.WithLabelValues(route, proto, tenant, strconv.Itoa(code))
	})
}

func (m *Metrics) backendObs(route, pool, backend, proto string) *backendObs {
	return cachedSeries(&m.byBackend, backendKey{route, pool, backend, proto}, func() *backendObs {
		return &backendObs{
			ttft: m.ttft.WithLabelValues(route, pool, backend, proto),
			itl:  m.itl.WithLabelValues(route, pool, backend, proto),
		}
	})
}

func (m *Metrics) tokenObs(route, tenant string) *tokenObs {
	return cachedSeries(&m.byTokens, tokenKey{route, tenant}, func() *tokenObs {
		return &tokenObs{
			in:  m.tokens.WithLabelValues(route, tenant, "in"),
			out: m.tokens.WithLabelValues(route, tenant, "out"),
		}
	})
}

// latencyBuckets span 0.5 ms to ~2 min; itlBuckets 1 ms to ~8 s.
var (
	latencyBuckets = prometheus.ExponentialBuckets(0.0005, 2, 19)
	itlBuckets     = prometheus.ExponentialBuckets(0.001, 1.5, 23)
)

// NewMetrics creates the metrics and registers them with reg. tenantLabels
// is how many distinct tenants get their own label value on the token and
// request counters; later tenants share "other", and 0 means no tenant
// label values at all ("-"), which keeps cardinality bounded.
func NewMetrics(reg prometheus.Registerer, tenantLabels int) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_requests_total", Help: "Requests by route, protocol, tenant and status code.",
		}, []string{"route", "proto", "tenant", "code"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_inflight_requests", Help: "Requests being served now.",
		}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_upstream_retries_total", Help: "Requests retried on another backend before the first token.",
		}, []string{"route"}),
		hedges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_hedges_total", Help: "Hedged requests by route and outcome (fired: sent to a second backend; won: the second answered first).",
		}, []string{"route", "outcome"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_refusals_total", Help: "Requests refused by limits (enforced=false: shadow mode, would have refused).",
		}, []string{"route", "reason", "enforced"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sluice_ttft_seconds", Help: "Time to first token as seen at the edge.", Buckets: latencyBuckets,
		}, []string{"route", "pool", "backend", "proto"}),
		itl: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sluice_itl_seconds", Help: "Inter-token latency at the edge, one sample per gap.", Buckets: itlBuckets,
		}, []string{"route", "pool", "backend", "proto"}),
		e2e: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sluice_request_duration_seconds", Help: "Whole request duration at the edge.", Buckets: latencyBuckets,
		}, []string{"route", "proto"}),
		stages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sluice_stage_seconds", Help: "Duration of each request stage (see docs/TIMING.md).", Buckets: latencyBuckets,
		}, []string{"route", "proto", "stage"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_tokens_total", Help: "Tokens by route, tenant and direction (in, out).",
		}, []string{"route", "tenant", "direction"}),
		wsConns: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_websocket_connections", Help: "Open WebSocket connections by mode (bridge, passthrough).",
		}, []string{"mode"}),
		wsSlow: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_websocket_slow_client_total", Help: "Bridged requests cancelled because the client read too slowly.",
		}),
		tenantCap: tenantLabels,
		tenants:   map[string]bool{},
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.inflight, m.retries, m.hedges, m.refusals, m.ttft, m.itl, m.e2e, m.stages, m.tokens,
			m.wsConns, m.wsSlow)
	}
	return m
}

// Retry counts a request retried on another backend.
func (m *Metrics) Retry(route string) {
	if m != nil {
		m.retries.WithLabelValues(route).Inc()
	}
}

// Hedge counts a hedge: outcome "fired" (sent to a second backend) or
// "won" (the second answered first).
func (m *Metrics) Hedge(route, outcome string) {
	if m != nil {
		m.hedges.WithLabelValues(route, outcome).Inc()
	}
}

// WebSocket modes, the label of sluice_websocket_connections.
const (
	WSModeBridge      = "bridge"
	WSModePassthrough = "passthrough"
)

// WSOpen adds delta to the open WebSocket connections of a mode.
func (m *Metrics) WSOpen(mode string, delta float64) {
	if m != nil {
		m.wsConns.WithLabelValues(mode).Add(delta)
	}
}

// WSSlowClient counts a bridged request cancelled because its client read
// too slowly.
func (m *Metrics) WSSlowClient() {
	if m != nil {
		m.wsSlow.Inc()
	}
}

// Inflight adds delta to the requests being served.
func (m *Metrics) Inflight(delta float64) {
	if m != nil {
		m.inflight.Add(delta)
	}
}

// tenantLabel bounds the tenant label's cardinality.
func (m *Metrics) tenantLabel(tenant string) string {
	if m.tenantCap == 0 || tenant == "" {
		return "-"
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.tenants[tenant] {
		return tenant
	}
	if len(m.tenants) < m.tenantCap {
		m.tenants[tenant] = true
		return tenant
	}
	return "other"
}

// Record observes a finished request.
func (m *Metrics) Record(r *Record) {
	if m == nil {
		return
	}
	route := r.routeLabel()
	tl := m.tenantLabel(r.Tenant)
	m.requestCounter(route, r.Proto, tl, r.Status).Inc()
	ro := m.routeObs(route, r.Proto)
	ro.e2e.Observe(r.End.Sub(r.Start).Seconds())
	if d := &r.Decision; d.Reason != "" && (!d.Allowed || d.WouldRefuse) {
		m.refusals.WithLabelValues(route, d.Reason, strconv.FormatBool(!d.WouldRefuse)).Inc()
	}
	for i, d := range r.Stages {
		if r.Measured[i] {
			ro.stages[i].Observe(d.Seconds())
		}
	}
	if r.Backend != "" && r.Measured[TTFT] {
		bo := m.backendObs(route, r.Pool, r.Backend, r.Proto)
		bo.ttft.Observe(r.Stages[TTFT].Seconds())
		for _, us := range r.ITL {
			bo.itl.Observe(float64(us) / 1e6)
		}
	}
	if r.Counted {
		to := m.tokenObs(route, tl)
		to.in.Add(float64(r.Usage.InputTokens))
		to.out.Add(float64(r.Usage.OutputTokens))
	}
}
