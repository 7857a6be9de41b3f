package proxy

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the pipeline's Prometheus metrics. A nil *Metrics records
// nothing.
type Metrics struct {
	requests *prometheus.CounterVec
	inflight prometheus.Gauge
	retries  *prometheus.CounterVec
	ttft     *prometheus.HistogramVec
	e2e      *prometheus.HistogramVec
	tokens   *prometheus.CounterVec
	wsConns  *prometheus.GaugeVec
	wsSlow   prometheus.Counter
}

// latencyBuckets span 1 ms to ~2 min.
var latencyBuckets = prometheus.ExponentialBuckets(0.001, 2, 18)

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_requests_total", Help: "Requests by route and status code.",
		}, []string{"route", "code"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_inflight_requests", Help: "Requests being served now.",
		}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_upstream_retries_total", Help: "Requests retried on another backend before the first token.",
		}, []string{"route"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sluice_ttft_seconds", Help: "Time to first token as seen at the edge.", Buckets: latencyBuckets,
		}, []string{"route"}),
		e2e: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sluice_request_duration_seconds", Help: "Whole request duration at the edge.", Buckets: latencyBuckets,
		}, []string{"route"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_tokens_total", Help: "Tokens by route and direction (in, out).",
		}, []string{"route", "direction"}),
		wsConns: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_websocket_connections", Help: "Open WebSocket connections by mode (bridge, passthrough).",
		}, []string{"mode"}),
		wsSlow: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_websocket_slow_client_total", Help: "Bridged requests cancelled because the client read too slowly.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.inflight, m.retries, m.ttft, m.e2e, m.tokens, m.wsConns, m.wsSlow)
	}
	return m
}

func (m *Metrics) retry(route string) {
	if m != nil {
		m.retries.WithLabelValues(route).Inc()
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

// observe records a finished request in metrics and the access log.
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
	if m := h.metrics; m != nil {
		m.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
		m.e2e.WithLabelValues(route).Observe(end.Sub(x.start).Seconds())
		if !x.firstToken.IsZero() {
			m.ttft.WithLabelValues(route).Observe(x.firstToken.Sub(x.start).Seconds())
		}
		if x.usage != nil {
			m.tokens.WithLabelValues(route, "in").Add(float64(x.usage.InputTokens))
			m.tokens.WithLabelValues(route, "out").Add(float64(x.usage.OutputTokens))
		}
	}
	if !h.log.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	attrs := []slog.Attr{
		slog.String("request_id", x.id),
		slog.String("method", x.r.Method),
		slog.String("path", x.r.URL.Path),
		slog.String("proto", x.r.Proto),
		slog.Int("status", status),
		slog.String("route", route),
		slog.Duration("duration", end.Sub(x.start)),
	}
	if x.tenant != nil {
		attrs = append(attrs, slog.String("tenant", x.tenant.ID))
	}
	if x.backend != nil {
		attrs = append(attrs, slog.String("backend", x.backend.URL.Host))
	}
	if !x.firstToken.IsZero() {
		attrs = append(attrs, slog.Duration("ttft", x.firstToken.Sub(x.start)))
	}
	if x.usage != nil {
		attrs = append(attrs, slog.Int64("tokens_in", x.usage.InputTokens), slog.Int64("tokens_out", x.usage.OutputTokens))
	}
	if x.retries > 0 {
		attrs = append(attrs, slog.Int("retries", x.retries))
	}
	if x.err != nil {
		attrs = append(attrs, slog.String("error", x.err.Error()))
	}
	h.log.LogAttrs(context.Background(), slog.LevelInfo, "request", attrs...)
}
