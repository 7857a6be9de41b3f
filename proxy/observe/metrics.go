package observe

import (
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the pipeline's Prometheus metrics. A nil *Metrics records
// nothing. Latencies are observed once a request has finished, so the
// per-token path does no metric work.
type Metrics struct {
	requests *shardCounterVec
	inflight prometheus.Gauge
	retries  *prometheus.CounterVec
	hedges   *prometheus.CounterVec
	refusals *prometheus.CounterVec
	ttft     *shardHistVec
	itl      *shardHistVec
	e2e      *shardHistVec
	stages   *shardHistVec
	tokens   *shardCounterVec
	wsConns  *prometheus.GaugeVec
	wsSlow   prometheus.Counter

	// The OpenTelemetry GenAI server metrics (see genai below).
	genTTFT, genTPOT, genDuration, genTokens *shardHistVec

	// tenants and models are the label values given out
	// (NewMetrics's tenantLabels and genAIModelCap at most).
	tenants, models labelSet

	// Series looked up once and kept, so that recording a request does
	// not hash its label values again: *routeObs by routeKey,
	// prometheus.Counter by requestKey, *backendObs by backendKey,
	// *tokenObs by tokenKey. Their cardinality is the metrics' own.
	byRoute, byRequest, byBackend, byTokens sync.Map
	// *genAIObs by genAIKey: latencies and duration in byGenAI, token
	// usage (errType "") in byGenAITokens.
	byGenAI, byGenAITokens sync.Map

	// *reqSeries by reqSeriesKey: all of the above that one kind of
	// request records into, found in one lookup instead of six. At most
	// reqSeriesCap kinds are kept; past that, Record resolves each series
	// in its own cache as before.
	byReq   sync.Map
	nByReq  atomic.Int64
	byReqMu sync.Mutex // serializes additions to byReq
	reqCap  int64      // reqSeriesCap (tests lower it)

	// lastReq holds, per P (min(GOMAXPROCS, 16) slots), the reqSeries
	// the last request recorded there used: a request of the same kind
	// compares its key with it instead of hashing the key for byReq.
	lastReq []lastReqSlot
}

// lastReqSlot is one P's last reqSeries, two cache lines wide so that no
// two Ps' slots share a line.
type lastReqSlot struct {
	s atomic.Pointer[reqSeries]
	_ [120]byte
}

// reqSeriesCap bounds byReq: its key is the product of labels that each
// series holds only some of, so its cardinality can exceed theirs.
const reqSeriesCap = 4096

// reqSeriesKey is what selects a request's series: the route's, tenant's
// (bounded label), backend's and GenAI's labels, and the outcome's.
type reqSeriesKey struct {
	route, proto, tenant, pool, backend, path, model, errType string
	code                                                      int
}

// reqSeries are the series of one reqSeriesKey, each resolved through its
// own cache the first time it is needed (a series is made only when it
// gets a sample, as before), then kept here.
type reqSeries struct {
	k           reqSeriesKey
	count       *shardCounter
	route       *routeObs
	genAI       *genAIObs // nil without a backend
	backend     atomic.Pointer[backendObs]
	tokens      atomic.Pointer[tokenObs]
	genAITokens atomic.Pointer[genAIObs]
}

// series returns k's series: the P's last ones when k is theirs, else
// byReq's (which it then remembers as the P's last).
func (m *Metrics) series(k reqSeriesKey) *reqSeries {
	slot := &m.lastReq[0].s
	if len(m.lastReq) > 1 {
		p := procPin()
		procUnpin()
		slot = &m.lastReq[uint(p)%uint(len(m.lastReq))].s
	}
	if s := slot.Load(); s != nil && s.k == k {
		return s
	}
	s := m.lookupSeries(k)
	slot.Store(s)
	return s
}

// lookupSeries returns k's series from byReq, making them the first time.
func (m *Metrics) lookupSeries(k reqSeriesKey) *reqSeries {
	if v, ok := m.byReq.Load(k); ok {
		return v.(*reqSeries)
	}
	s := &reqSeries{k: k, count: m.requestCounter(k.route, k.proto, k.tenant, k.code), route: m.routeObs(k.route, k.proto)}
	if k.backend != "" {
		s.genAI = m.genAIObs(genAIKey{k.path, k.model, k.backend, k.errType})
	}
	if m.nByReq.Load() >= m.reqCap {
		return s // not kept: its series are each in their own cache
	}
	m.byReqMu.Lock()
	defer m.byReqMu.Unlock()
	if m.nByReq.Load() >= m.reqCap {
		return s
	}
	v, loaded := m.byReq.LoadOrStore(k, s)
	if !loaded {
		m.nByReq.Add(1)
	}
	return v.(*reqSeries)
}

func (s *reqSeries) backendObs(m *Metrics) *backendObs {
	if o := s.backend.Load(); o != nil {
		return o
	}
	o := m.backendObs(s.k.route, s.k.pool, s.k.backend, s.k.proto)
	s.backend.Store(o)
	return o
}

func (s *reqSeries) tokenObs(m *Metrics) *tokenObs {
	if o := s.tokens.Load(); o != nil {
		return o
	}
	o := m.tokenObs(s.k.route, s.k.tenant)
	s.tokens.Store(o)
	return o
}

func (s *reqSeries) genAITokenObs(m *Metrics) *genAIObs {
	if o := s.genAITokens.Load(); o != nil {
		return o
	}
	o := m.genAITokens(genAIKey{s.k.path, s.k.model, s.k.backend, s.k.errType})
	s.genAITokens.Store(o)
	return o
}

type (
	routeKey   struct{ route, proto string }
	requestKey struct {
		route, proto, tenant string
		code                 int
	}
	backendKey struct{ route, pool, backend, proto string }
	tokenKey   struct{ route, tenant string }
	genAIKey   struct{ path, model, backend, errType string }
)

// genAIObs are the GenAI series of one (operation, model, backend, error).
type genAIObs struct {
	ttft, tpot, duration, tokIn, tokOut *shardHist
}

// routeObs are a (route, proto)'s duration series: e2e, and each stage in
// the order of Timed.
type routeObs struct {
	e2e    *shardHist
	stages [len(Timed)]*shardHist
}

type backendObs struct{ ttft, itl *shardHist }

type tokenObs struct{ in, out *shardCounter }

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

func (m *Metrics) requestCounter(route, proto, tenant string, code int) *shardCounter {
	return cachedSeries(&m.byRequest, requestKey{route, proto, tenant, code}, func() *shardCounter {
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

// genAILabelsOf returns k's label values for the GenAI series.
func genAILabelsOf(k genAIKey) prometheus.Labels {
	op, provider := genAIOperation(k.path)
	addr, port, err := net.SplitHostPort(k.backend)
	if err != nil {
		addr, port = k.backend, ""
	}
	return prometheus.Labels{"gen_ai_operation_name": op, "gen_ai_provider_name": provider,
		"gen_ai_request_model": k.model, "server_address": addr, "server_port": port}
}

// genAIObs returns k's latency series: TTFT, time per output token and
// duration for a successful request (errType ""), the duration alone for a
// failed one, so that no series exists without a sample.
func (m *Metrics) genAIObs(k genAIKey) *genAIObs {
	return cachedSeries(&m.byGenAI, k, func() *genAIObs {
		l := genAILabelsOf(k)
		o := &genAIObs{}
		if k.errType == "" {
			o.ttft, o.tpot = m.genTTFT.With(l), m.genTPOT.With(l)
		}
		l["error_type"] = k.errType
		o.duration = m.genDuration.With(l)
		return o
	})
}

// genAITokens returns k's token usage series (k.errType is ignored).
func (m *Metrics) genAITokens(k genAIKey) *genAIObs {
	k.errType = ""
	return cachedSeries(&m.byGenAITokens, k, func() *genAIObs {
		l := genAILabelsOf(k)
		l["gen_ai_token_type"] = "input"
		in := m.genTokens.With(l)
		l["gen_ai_token_type"] = "output"
		return &genAIObs{tokIn: in, tokOut: m.genTokens.With(l)}
	})
}

// genAIOperation names a request path's GenAI operation and provider (the
// API's flavour, as gen_ai.provider.name means it), as dialectOf in package
// proxy reads the path: Anthropic's Messages API is "anthropic", the
// OpenAI APIs (as self-hosted engines serve them) are "openai"; legacy
// completions are "text_completion", the rest "chat".
func genAIOperation(path string) (op, provider string) {
	path = strings.TrimSuffix(path, "/")
	switch {
	case strings.HasSuffix(path, "/chat/completions"), strings.HasSuffix(path, "/responses"):
		return "chat", "openai"
	case strings.HasSuffix(path, "/completions"):
		return "text_completion", "openai"
	case strings.HasSuffix(path, "/messages"):
		return "chat", "anthropic"
	}
	return "chat", "openai"
}

// genAIPath is the path's GenAI class, the key's part that genAIOperation
// reads, so that raw paths do not multiply the cached keys.
func genAIPath(path string) string {
	path = strings.TrimSuffix(path, "/")
	for _, p := range [...]string{"/chat/completions", "/responses", "/completions", "/messages"} {
		if strings.HasSuffix(path, p) {
			return p
		}
	}
	return ""
}

// genAIModelCap bounds the gen_ai_request_model label's values: the
// request's model is the client's string, so models beyond the first 100
// seen share "other".
const genAIModelCap = 100

// modelLabel bounds the model label's cardinality.
func (m *Metrics) modelLabel(model string) string { return m.models.label(model) }

// labelSet is a bounded set of label values given out: a value seen before
// is looked up without a lock (every request does that); only the first
// sight of a value takes the lock. Past max values, the rest share
// "other".
type labelSet struct {
	max  int64
	n    atomic.Int64 // values in seen
	mu   sync.Mutex   // serializes additions
	seen sync.Map     // string → struct{}
}

// label returns v when it is (or now becomes) one of the set's values,
// else "other".
func (s *labelSet) label(v string) string {
	if _, ok := s.seen.Load(v); ok {
		return v
	}
	if s.n.Load() >= s.max {
		return "other"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.seen.Load(v); ok {
		return v
	}
	if s.n.Load() >= s.max {
		return "other"
	}
	s.seen.Store(v, struct{}{})
	s.n.Add(1)
	return v
}

// latencyBuckets span 0.5 ms to ~2 min; itlBuckets 1 ms to ~8 s.
var (
	latencyBuckets = prometheus.ExponentialBuckets(0.0005, 2, 19)
	itlBuckets     = prometheus.ExponentialBuckets(0.001, 1.5, 23)
)

// The classic bucket boundaries the OpenTelemetry GenAI semantic
// conventions recommend (semantic-conventions v1.41.0,
// docs/gen-ai/gen-ai-metrics.md, ExplicitBucketBoundaries).
var (
	otelTTFTBuckets     = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0}
	otelTPOTBuckets     = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5}
	otelDurationBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	otelTokenBuckets    = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
)

// Native (sparse) histogram settings of the latency histograms, exposed
// beside their classic buckets: a Prometheus that scrapes the protobuf
// format (native histograms enabled) gets buckets at most 10% wide, the
// text format and older servers the classic ones. The bucket count is
// bounded: past nativeMaxBuckets the resolution halves, and a histogram is
// reset to full resolution at most once an hour.
const (
	nativeFactor     = 1.1
	nativeMaxBuckets = 160
	nativeMinReset   = time.Hour
)

// histogram is a histogram vector with classic buckets and, when native
// is set, native ones too: what client_golang's HistogramVec with these
// options exposes, counted in per-P shards without its sync.Map lookup
// per native observation (see shardHistVec).
func histogram(name, help string, buckets []float64, native bool, labels ...string) *shardHistVec {
	o := histOpts{name: name, help: help, labels: labels, buckets: buckets}
	if native {
		o.factor, o.maxBuckets, o.minReset = nativeFactor, nativeMaxBuckets, nativeMinReset
	}
	return newShardHistVec(o)
}

// NewMetrics creates the metrics and registers them with reg. tenantLabels
// is how many distinct tenants get their own label value on the token and
// request counters; later tenants share "other", and 0 means no tenant
// label values at all ("-"), which keeps cardinality bounded.
func NewMetrics(reg prometheus.Registerer, tenantLabels int) *Metrics {
	m := &Metrics{
		requests: newShardCounterVec("sluice_requests_total", "Requests by route, protocol, tenant and status code.",
			[]string{"route", "proto", "tenant", "code"}, 0),
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
		ttft: histogram("sluice_ttft_seconds", "Time to first token as seen at the edge.", latencyBuckets, true,
			"route", "pool", "backend", "proto"),
		itl: histogram("sluice_itl_seconds", "Inter-token latency at the edge, one sample per gap.", itlBuckets, true,
			"route", "pool", "backend", "proto"),
		e2e: histogram("sluice_request_duration_seconds", "Whole request duration at the edge.", latencyBuckets, false,
			"route", "proto"),
		stages: histogram("sluice_stage_seconds", "Duration of each request stage (see docs/TIMING.md).", latencyBuckets, true,
			"route", "proto", "stage"),
		tokens: newShardCounterVec("sluice_tokens_total", "Tokens by route, tenant and direction (in, out).",
			[]string{"route", "tenant", "direction"}, 0),
		wsConns: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_websocket_connections", Help: "Open WebSocket connections by mode (bridge, passthrough).",
		}, []string{"mode"}),
		wsSlow: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_websocket_slow_client_total", Help: "Bridged requests cancelled because the client read too slowly.",
		}),
		genTTFT: histogram("gen_ai_server_time_to_first_token_seconds",
			"Time to generate first token for successful responses (OpenTelemetry gen_ai.server.time_to_first_token, measured at the edge).",
			otelTTFTBuckets, true, genAILabels...),
		genTPOT: histogram("gen_ai_server_time_per_output_token_seconds",
			"Time per output token generated after the first token for successful responses (OpenTelemetry gen_ai.server.time_per_output_token).",
			otelTPOTBuckets, true, genAILabels...),
		genDuration: histogram("gen_ai_server_request_duration_seconds",
			"Generative AI server request duration, to the last output token (OpenTelemetry gen_ai.server.request.duration).",
			otelDurationBuckets, true, append([]string{"error_type"}, genAILabels...)...),
		genTokens: histogram("gen_ai_client_token_usage",
			"Number of input and output tokens used (OpenTelemetry gen_ai.client.token.usage).",
			otelTokenBuckets, false, append([]string{"gen_ai_token_type"}, genAILabels...)...),
	}
	m.tenants.max, m.models.max, m.reqCap = int64(tenantLabels), genAIModelCap, reqSeriesCap
	m.lastReq = make([]lastReqSlot, min(runtime.GOMAXPROCS(0), maxShards))
	if reg != nil {
		reg.MustRegister(m.requests, m.inflight, m.retries, m.hedges, m.refusals, m.ttft, m.itl, m.e2e, m.stages, m.tokens,
			m.wsConns, m.wsSlow, m.genTTFT, m.genTPOT, m.genDuration, m.genTokens)
	}
	return m
}

// genAILabels are the OpenTelemetry GenAI metrics' attributes as
// Prometheus labels (dots become underscores). gen_ai_response_model is
// not among them: Sluice does not read the model name out of responses.
var genAILabels = []string{"gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model",
	"server_address", "server_port"}

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
	if m.tenants.max == 0 || tenant == "" {
		return "-"
	}
	return m.tenants.label(tenant)
}

// Record observes a finished request.
func (m *Metrics) Record(r *Record) {
	if m == nil {
		return
	}
	k := reqSeriesKey{route: r.routeLabel(), proto: r.Proto, tenant: m.tenantLabel(r.Tenant), code: r.Status}
	if r.Backend != "" {
		k.pool, k.backend = r.Pool, r.Backend
		k.path, k.model, k.errType = genAIPath(r.Path), m.modelLabel(r.Model), r.Error
		if k.errType == "" && r.Status >= 400 {
			k.errType = strconv.Itoa(r.Status)
		}
	}
	s := m.series(k)
	s.count.Inc()
	ro := s.route
	ro.e2e.Observe(r.End.Sub(r.Start).Seconds())
	if d := &r.Decision; d.Reason != "" && (!d.Allowed || d.WouldRefuse) {
		m.refusals.WithLabelValues(k.route, d.Reason, strconv.FormatBool(!d.WouldRefuse)).Inc()
	}
	for i, d := range r.Stages {
		if r.Measured[i] {
			ro.stages[i].Observe(d.Seconds())
		}
	}
	if r.Backend != "" && r.Measured[TTFT] {
		bo := s.backendObs(m)
		bo.ttft.Observe(r.Stages[TTFT].Seconds())
		bo.itl.observeMicros(r.ITL)
	}
	if r.Counted {
		to := s.tokenObs(m)
		to.in.Add(float64(r.Usage.InputTokens))
		to.out.Add(float64(r.Usage.OutputTokens))
	}
	m.recordGenAI(r, s)
}

// recordGenAI observes the GenAI server metrics of a request that reached
// a model server: TTFT and time per output token for successful ones
// (decode time over the tokens after the first), duration for all, with
// error_type set for failures (the error class, else the status code), and
// token usage when tokens were counted.
func (m *Metrics) recordGenAI(r *Record, s *reqSeries) {
	if r.Backend == "" {
		return
	}
	o := s.genAI
	o.duration.Observe(r.End.Sub(r.Start).Seconds())
	if s.k.errType == "" && r.Measured[TTFT] {
		o.ttft.Observe(r.Stages[TTFT].Seconds())
		if out := r.Usage.OutputTokens; r.Counted && out > 1 && r.Measured[Decode] {
			o.tpot.Observe(r.Stages[Decode].Seconds() / float64(out-1))
		}
	}
	if r.Counted {
		t := s.genAITokenObs(m)
		t.tokIn.Observe(float64(r.Usage.InputTokens))
		t.tokOut.Observe(float64(r.Usage.OutputTokens))
	}
}
