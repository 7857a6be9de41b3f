package certs

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go/http3"
)

// Store holds the current certificates of a listener and serves them to
// TLS handshakes through GetCertificate. Reload and Check re-read the files
// and swap in new certificates (a file watcher calls Check; see WatchDirs);
// a handshake uses whatever was current when it started, so open
// connections are never affected by a reload.
//
// A Store is safe for simultaneous use by multiple goroutines.
type Store struct {
	log        *slog.Logger
	met        *metrics
	minVersion uint16
	poll       time.Duration // <= 0: no polling
	now        func() time.Time

	cur atomic.Pointer[index]

	mu      sync.Mutex // serialises reloads; guards entries and exp
	entries []*entry
	exp     map[string]bool // label values of the expiry gauge in use

	devPEM []byte // set by New, never changed

	acme *acmeManager // nil without https.acme
}

// entry is one certificate source: a file pair, or the dev certificate.
type entry struct {
	dev     bool // the development certificate: nothing to reload
	pair    Pair // zero for the dev certificate
	cert    *tls.Certificate
	loaded  [32]byte // content hash of what cert was built from
	attempt [32]byte // hash of the last content (or error) looked at
}

// New loads every pair of cfg (and makes the development certificate if
// cfg.DevCert is set). Any pair that fails CheckPair makes New fail. log may
// be nil (slog.Default is used); reg may be nil (metrics are kept but not
// registered). Have a file watcher call Check to reload on file changes.
func New(cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	minVersion, _ := parseMinVersion(cfg.MinVersion) // checked by Validate
	if log == nil {
		log = slog.Default()
	}
	met, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	s := &Store{
		log:        log,
		met:        met,
		minVersion: minVersion,
		poll:       cfg.pollInterval(),
		now:        time.Now,
		exp:        make(map[string]bool),
	}
	var errs []error
	for _, p := range cfg.Certificates {
		e, err := s.loadEntry(p)
		errs = append(errs, err)
		s.entries = append(s.entries, e)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	if cfg.DevCert {
		if err := s.addDevCert(); err != nil {
			return nil, fmt.Errorf("certs: %w", err)
		}
	}
	if cfg.ACME != nil {
		if s.acme, err = newACMEManager(*cfg.ACME, log, reg); err != nil {
			return nil, fmt.Errorf("certs: %w", err)
		}
	}
	s.publish()
	return s, nil
}

func (s *Store) loadEntry(p Pair) (*entry, error) {
	certPEM, keyPEM, err := readPair(p)
	if err != nil {
		return nil, err
	}
	c, err := parsePair(p, certPEM, keyPEM, s.now())
	if err != nil {
		return nil, err
	}
	h := contentHash(certPEM, keyPEM)
	return &entry{pair: p, cert: c, loaded: h, attempt: h}, nil
}

// publish rebuilds the index from entries and the expiry gauges. Callers
// hold s.mu (or own s exclusively, as New does).
func (s *Store) publish() {
	certs := make([]*tls.Certificate, len(s.entries))
	for i, e := range s.entries {
		certs[i] = e.cert
	}
	s.cur.Store(newIndex(certs))
	s.updateExpiry(certs)
}

// GetCertificate chooses the certificate for a handshake (see the package
// documentation for the order). It is meant for tls.Config.GetCertificate.
func (s *Store) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if s.acme != nil && (s.acme.wants(hello) || len(s.cur.Load().certs) == 0) {
		return s.acme.magic.GetCertificate(hello)
	}
	if c := s.cur.Load().lookup(hello); c != nil {
		return c, nil
	}
	return nil, errors.New("certs: no certificate available")
}

// Certificates returns the certificates currently served (each with its
// parsed Leaf), in config order, the development certificate last. They are
// shared with the Store and must not be modified.
func (s *Store) Certificates() []*tls.Certificate {
	return append([]*tls.Certificate(nil), s.cur.Load().certs...)
}

// Pins returns the SHA-256 SPKI pin (see SPKIPin) of every certificate
// currently served, in config order, without duplicates.
func (s *Store) Pins() []string {
	var pins []string
	seen := make(map[string]bool)
	for _, c := range s.cur.Load().certs {
		p := SPKIPin(c.Leaf)
		if !seen[p] {
			seen[p] = true
			pins = append(pins, p)
		}
	}
	return pins
}

// DevCertPEM returns the development certificate in PEM form (for
// curl --cacert), or nil if the Store has none. The key is never exported.
func (s *Store) DevCertPEM() []byte {
	return append([]byte(nil), s.devPEM...)
}

// modernSuites are the TLS 1.2 suites offered: ECDHE key exchange with an
// AEAD only. TLS 1.3 suites are not configurable in crypto/tls.
var modernSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// TLSConfig returns a new *tls.Config for a TCP listener (HTTP/1.1 and
// HTTP/2): the configured MinVersion, ECDHE+AEAD suites for TLS 1.2, ALPN
// "h2" then "http/1.1" (then "acme-tls/1" when ACME may use TLS-ALPN-01),
// and certificates from the Store. Each call returns
// a fresh value that the caller may change.
func (s *Store) TLSConfig() *tls.Config {
	protos := []string{"h2", "http/1.1"}
	if s.acme != nil && s.acme.cfg.challenge(ChallengeTLSALPN) {
		protos = append(protos, ALPNACME) // last: never chosen by browsers
	}
	return &tls.Config{
		MinVersion:     s.minVersion,
		CipherSuites:   append([]uint16(nil), modernSuites...),
		NextProtos:     protos,
		GetCertificate: s.GetCertificate,
	}
}

// QUICConfig returns a new *tls.Config for a QUIC listener (HTTP/3): TLS 1.3
// only, ALPN "h3", certificates from the Store. It is prepared with
// http3.ConfigureTLSConfig, so it suits quic.ListenEarly plus
// http3.Server.ServeListener as well as http3.Server.TLSConfig.
func (s *Store) QUICConfig() *tls.Config {
	return http3.ConfigureTLSConfig(&tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: s.GetCertificate,
	})
}
