package certs

import (
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	reloads      prometheus.Counter
	reloadErrors *prometheus.CounterVec
	expiry       *prometheus.GaugeVec
	expiryOld    *prometheus.GaugeVec // expiry's deprecated name
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		reloads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_tls_reloads_total",
			Help: "Certificate pairs replaced after their files changed.",
		}),
		reloadErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_tls_reload_errors_total",
			Help: "Failed certificate reloads (old pair kept), by file at fault.",
		}, []string{"file"}),
		expiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_tls_cert_expiry_timestamp_seconds",
			Help: "NotAfter of the served certificate as a Unix time, by primary name.",
		}, []string{"name"}),
		// The same gauge under its name before the _timestamp_seconds
		// suffix, kept for one release (docs/OPERATIONS.md, "Metric renames").
		expiryOld: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_tls_cert_expiry_seconds",
			Help: "Deprecated: use sluice_tls_cert_expiry_timestamp_seconds (same value).",
		}, []string{"name"}),
	}
	if reg == nil {
		return m, nil
	}
	var err1, err2, err3, err4 error
	m.reloads, err1 = register(reg, m.reloads)
	m.reloadErrors, err2 = register(reg, m.reloadErrors)
	m.expiry, err3 = register(reg, m.expiry)
	m.expiryOld, err4 = register(reg, m.expiryOld)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	return m, nil
}

// register registers c, or returns the collector already registered under
// the same name (several Stores may share one registry).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, err
}

// primaryName labels a certificate: its first DNS SAN, else its first IP
// SAN, else its subject common name.
func primaryName(c *tls.Certificate) string {
	switch l := c.Leaf; {
	case len(l.DNSNames) > 0:
		return l.DNSNames[0]
	case len(l.IPAddresses) > 0:
		return l.IPAddresses[0].String()
	default:
		return l.Subject.CommonName
	}
}

// updateExpiry sets the expiry gauge to the earliest NotAfter per primary
// name and removes names no longer served. Callers hold s.mu.
func (s *Store) updateExpiry(certs []*tls.Certificate) {
	next := make(map[string]float64)
	for _, c := range certs {
		n := primaryName(c)
		t := float64(c.Leaf.NotAfter.Unix())
		if old, ok := next[n]; !ok || t < old {
			next[n] = t
		}
	}
	for n := range s.exp {
		if _, ok := next[n]; !ok {
			s.met.expiry.DeleteLabelValues(n)
			s.met.expiryOld.DeleteLabelValues(n)
			delete(s.exp, n)
		}
	}
	for n, t := range next {
		s.met.expiry.WithLabelValues(n).Set(t)
		s.met.expiryOld.WithLabelValues(n).Set(t)
		s.exp[n] = true
	}
}
