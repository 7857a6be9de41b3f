package proxy

import (
	"strconv"
	"sync"
	"time"

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
// the order of headerStages followed by decode.
type routeObs struct {
	e2e    prometheus.Observer
	stages [len(headerStages) + 1]prometheus.Observer
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
		for i, s := range headerStages {
			o.stages[i] = m.stages.WithLabelValues(route, proto, s)
		}
		o.stages[len(headerStages)] = m.stages.WithLabelValues(route, proto, StageDecode)
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

func (m *Metrics) retry(route string) {
	if m != nil {
		m.retries.WithLabelValues(route).Inc()
	}
}

func (m *Metrics) hedge(route, outcome string) {
	if m != nil {
		m.hedges.WithLabelValues(route, outcome).Inc()
	}
}

// WebSocket modes, the label of sluice_websocket_connections.
const (
	wsModeBridge      = "bridge"
	wsModePassthrough = "passthrough"
)

func (m *Metrics) wsOpen(mode string, delta float64) {
	if m != nil {
		m.wsConns.WithLabelValues(mode).Add(delta)
	}
}

func (m *Metrics) wsSlowClient() {
	if m != nil {
		m.wsSlow.Inc()
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

// record observes a finished request.
func (m *Metrics) record(x *exchange, route, proto string, status int, end time.Time) {
	tenant := ""
	if x.tenant != nil {
		tenant = x.tenant.ID
	}
	tl := m.tenantLabel(tenant)
	m.requestCounter(route, proto, tl, status).Inc()
	ro := m.routeObs(route, proto)
	ro.e2e.Observe(end.Sub(x.start).Seconds())
	if d := x.decision; d.Reason != "" && (!d.Allowed || d.WouldRefuse) {
		m.refusals.WithLabelValues(route, d.Reason, strconv.FormatBool(!d.WouldRefuse)).Inc()
	}
	for i, s := range headerStages {
		if d, ok := x.stage(s); ok {
			ro.stages[i].Observe(d.Seconds())
		}
	}
	if d, ok := x.stage(StageDecode); ok {
		ro.stages[len(headerStages)].Observe(d.Seconds())
	}
	if x.backend != nil && !x.firstToken.IsZero() {
		bo := m.backendObs(route, x.route.Pool.Name(), x.backend.URL.Host, proto)
		bo.ttft.Observe(x.firstToken.Sub(x.start).Seconds())
		if x.itl != nil {
			for _, us := range *x.itl {
				bo.itl.Observe(float64(us) / 1e6)
			}
		}
	}
	if x.usage != nil || x.tokens > 0 {
		u := x.consumed()
		to := m.tokenObs(route, tl)
		to.in.Add(float64(u.InputTokens))
		to.out.Add(float64(u.OutputTokens))
	}
}

// errorClass names the kind of failure for logs: "" when none.
func errorClass(x *exchange) string {
	switch {
	case x.err == nil:
		return ""
	case x.decision.Reason != "" && !x.decision.Allowed:
		return "limit_" + x.decision.Reason
	}
	return statusOf(x.err).Code
}

// observe records a finished request in metrics, stats and the access log.
func (h *Handler) observe(x *exchange) {
	end := time.Now()
	route := "-"
	if x.route != nil {
		route = x.route.Name
	}
	status := x.status
	if status == 0 {
		status = 499
	}
	proto := protoOf(x.r, x.conn)
	if h.metrics != nil {
		h.metrics.record(x, route, proto, status, end)
	}
	if h.stats != nil && x.route != nil {
		h.stats.record(x, route, end)
	}
	if h.access != nil {
		h.access.write(x, route, proto, status, end)
	}
}

// stageLogKeys are the access log keys of headerStages ("auth_ms"),
// made once rather than per request.
var stageLogKeys = func() (keys [len(headerStages)]string) {
	for i, s := range headerStages {
		keys[i] = s + "_ms"
	}
	return keys
}()

// write is the access log line: ids, outcome, every stage, tokens, bytes.
// Keys and prompt text are never logged.
func (a *AccessLog) write(x *exchange, route, proto string, status int, end time.Time) {
	l := a.begin(end)
	l.str("request_id", x.id)
	tenant := ""
	if x.tenant != nil {
		tenant = x.tenant.ID
	}
	l.str("tenant", tenant)
	l.str("method", x.r.Method)
	l.str("path", x.r.URL.Path)
	l.str("proto", proto)
	l.int("status", int64(status))
	l.str("route", route)
	backend := ""
	if x.backend != nil {
		backend = x.backend.URL.Host
	}
	l.str("backend", backend)
	l.str("model", x.meta.Model)
	for i, s := range headerStages {
		if d, ok := x.stage(s); ok {
			l.ms(stageLogKeys[i], d)
		}
	}
	if d, ok := x.stage(StageDecode); ok {
		l.ms("decode_ms", d)
	}
	l.ms("e2e_ms", end.Sub(x.start))
	p50, p99, _, n := x.itlPercentiles()
	if n > 0 {
		l.ms("itl_p50_ms", p50)
		l.ms("itl_p99_ms", p99)
	}
	u := x.consumed()
	l.int("tokens_in", u.InputTokens)
	l.int("tokens_out", u.OutputTokens)
	l.int("bytes_out", x.bytesToUser)
	l.int("bytes_in", int64(len(x.body)))
	l.int("retries", int64(x.retries))
	if x.hedged {
		l.boolean("hedged", true)
	}
	if x.decision.WouldRefuse {
		l.str("would_refuse", x.decision.Reason)
	}
	l.str("error", errorClass(x))
	a.end(&l)
}
