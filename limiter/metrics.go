package limiter

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics of a Shared limiter. Counters are resolved once so that the hot
// path does no label lookups.
type metrics struct {
	degraded    *prometheus.CounterVec // by policy
	decisions   *prometheus.CounterVec // by source and result
	storeErrors prometheus.Counter
	breakerOpen prometheus.Gauge

	degradedLocal, degradedOpen, degradedClosed prometheus.Counter
	denyHit, ceilingRefused                     prometheus.Counter
	storeAllowed, storeRefused                  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		degraded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_limiter_degraded_total",
			Help: "Admission decisions made without the shared store, by store-failure policy.",
		}, []string{"policy"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_limiter_decisions_total",
			Help: "Admission decisions by source (deny_cache, local_ceiling, store) and result.",
		}, []string{"source", "result"}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_limiter_store_errors_total",
			Help: "Shared-store admissions that failed or timed out.",
		}),
		breakerOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_limiter_breaker_open",
			Help: "1 while the circuit breaker keeps admissions away from the shared store.",
		}),
	}
	m.degraded = register(reg, m.degraded)
	m.decisions = register(reg, m.decisions)
	m.storeErrors = register(reg, m.storeErrors)
	m.breakerOpen = register(reg, m.breakerOpen)
	m.degradedLocal = m.degraded.WithLabelValues(PolicyLocal)
	m.degradedOpen = m.degraded.WithLabelValues(PolicyOpen)
	m.degradedClosed = m.degraded.WithLabelValues(PolicyClosed)
	m.denyHit = m.decisions.WithLabelValues("deny_cache", "refused")
	m.ceilingRefused = m.decisions.WithLabelValues("local_ceiling", "refused")
	m.storeAllowed = m.decisions.WithLabelValues("store", "allowed")
	m.storeRefused = m.decisions.WithLabelValues("store", "refused")
	return m
}

// register registers c, or returns the collector already registered under
// the same name (several limiters on one registry share their metrics).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
	}
	return c
}

func (m *metrics) degradedFor(policy string) prometheus.Counter {
	switch policy {
	case PolicyOpen:
		return m.degradedOpen
	case PolicyClosed:
		return m.degradedClosed
	}
	return m.degradedLocal
}
