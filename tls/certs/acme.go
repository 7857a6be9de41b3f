package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// ACME challenge types accepted in ACMEConfig.Challenges.
const (
	ChallengeTLSALPN = "tls-alpn-01"
	ChallengeHTTP    = "http-01"
)

// ALPNACME is the ALPN protocol of TLS-ALPN-01 validation (RFC 8737). The
// TCP TLS listener offers it after h2 and http/1.1 when ACME is on.
const ALPNACME = "acme-tls/1"

// Defaults of ACMEConfig.
const (
	DefaultACMEWindowRatio   = 1.0 / 3
	DefaultACMECheckInterval = 10 * time.Minute
	DefaultACMECA            = certmagic.LetsEncryptProductionCA
)

// ACMEConfig obtains and renews certificates from an ACME CA (the https.acme
// key). The library is certmagic: it solves TLS-ALPN-01 on the HTTPS
// listener and HTTP-01 on the plain HTTP listener, keeps certificates and
// account keys on disk, locks through that storage so that nodes sharing
// the directory do not order the same certificate twice, and staples OCSP
// responses when the certificate names a responder.
type ACMEConfig struct {
	// Email is the ACME account contact. Optional (recommended).
	Email string `yaml:"email"`
	// Domains are the names to get certificates for. Required; each is a
	// DNS name (no wildcard: neither challenge can prove one).
	Domains []string `yaml:"domains"`
	// CA is the ACME directory URL. Empty: Let's Encrypt production.
	CA string `yaml:"ca"`
	// CARootFile is a PEM bundle trusted for the CA's own HTTPS endpoint
	// (a private or test CA); empty means the system roots.
	CARootFile string `yaml:"ca_root_file"`
	// Storage is the directory of certificates, keys, account and locks.
	// Required. Nodes that mount the same directory share certificates
	// and take turns ordering them (lock files in that directory).
	Storage string `yaml:"storage"`
	// Challenges are the challenge types allowed: "tls-alpn-01" (on the
	// https listener) and "http-01" (on the http listener, which must then
	// be configured). Empty: both that can be served.
	Challenges []string `yaml:"challenges"`
	// Profile is the ACME certificate profile to ask for (draft
	// ietf-acme-profiles, e.g. "shortlived"); empty: the CA's default.
	Profile string `yaml:"profile"`
	// RenewWindowRatio renews a certificate when this fraction of its
	// lifetime remains (0 < r < 1). Zero means 1/3. The CA's renewal
	// information (ARI, RFC 9773) is followed when it asks for earlier.
	RenewWindowRatio float64 `yaml:"renew_window_ratio"`
	// CheckInterval is how often certificates are checked for renewal
	// and OCSP staples refreshed. Zero means 10m.
	CheckInterval time.Duration `yaml:"check_interval"`
	// DisableOCSPStapling turns off fetching and stapling OCSP responses.
	DisableOCSPStapling bool `yaml:"disable_ocsp_stapling"`
}

// FieldError is one problem of an ACMEConfig: Key is the field's path
// below https.acme (e.g. "domains[1]"), Msg says what is wrong.
type FieldError struct {
	Key, Msg string
}

// Check checks the settings that need no network: domains, storage,
// challenge names, ratio and the CA root file when given. httpListener
// tells whether an http listener exists (http-01 needs one).
func (c *ACMEConfig) Check(httpListener bool) []FieldError {
	var errs []FieldError
	add := func(key, format string, args ...any) {
		errs = append(errs, FieldError{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	if len(c.Domains) == 0 {
		add("domains", "acme.domains: at least one name is required")
	}
	for i, d := range c.Domains {
		if strings.Contains(d, "*") || net.ParseIP(d) != nil || !validDNSName(d) {
			add(fmt.Sprintf("domains[%d]", i), "acme.domains[%d] %q: want a DNS name (no wildcard, no IP address)", i, d)
		}
	}
	if c.Storage == "" {
		add("storage", "acme.storage: a directory is required")
	}
	for i, ch := range c.Challenges {
		key := fmt.Sprintf("challenges[%d]", i)
		switch ch {
		case ChallengeTLSALPN:
		case ChallengeHTTP:
			if !httpListener {
				add(key, "acme.challenges[%d] %q: needs listeners.http (port 80 reachable from the CA)", i, ch)
			}
		default:
			add(key, "acme.challenges[%d] %q: want %q or %q", i, ch, ChallengeTLSALPN, ChallengeHTTP)
		}
	}
	if r := c.RenewWindowRatio; r < 0 || r >= 1 {
		add("renew_window_ratio", "acme.renew_window_ratio %v: want 0 < r < 1", r)
	}
	if c.CheckInterval < 0 {
		add("check_interval", "acme.check_interval %v: must not be negative", c.CheckInterval)
	}
	if c.CA != "" && !strings.HasPrefix(c.CA, "https://") {
		add("ca", "acme.ca %q: want an https:// directory URL", c.CA)
	}
	if c.CARootFile != "" {
		if _, err := readRoots(c.CARootFile); err != nil {
			add("ca_root_file", "acme.ca_root_file: %v", err)
		}
	}
	return errs
}

// Validate is Check as one error (nil when all is well), assuming an http
// listener exists.
func (c *ACMEConfig) Validate() error {
	var errs []error
	for _, fe := range c.Check(true) {
		errs = append(errs, errors.New(fe.Msg))
	}
	return errors.Join(errs...)
}

func validDNSName(d string) bool {
	if d == "" || len(d) > 253 {
		return false
	}
	for _, l := range strings.Split(d, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

func readRoots(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no PEM certificate", file)
	}
	return pool, nil
}

// challenge reports whether the challenge type ch is allowed.
func (c *ACMEConfig) challenge(ch string) bool {
	return len(c.Challenges) == 0 || slices.Contains(c.Challenges, ch)
}

// acmeManager is the certmagic side of a Store.
type acmeManager struct {
	cfg     ACMEConfig
	cache   *certmagic.Cache
	magic   *certmagic.Config
	issuer  *certmagic.ACMEIssuer
	domains map[string]bool // lower case
	log     *slog.Logger

	obtained *prometheus.CounterVec
	failed   prometheus.Counter

	startOnce sync.Once
	stopOnce  sync.Once
	cancel    context.CancelFunc
}

func newACMEManager(c ACMEConfig, log *slog.Logger, reg prometheus.Registerer) (*acmeManager, error) {
	m := &acmeManager{cfg: c, log: log, domains: make(map[string]bool)}
	for _, d := range c.Domains {
		m.domains[strings.ToLower(d)] = true
	}
	m.obtained = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_tls_acme_certificates_obtained_total",
		Help: "Certificates obtained from the ACME CA, by renewal (\"true\" or \"false\").",
	}, []string{"renewal"})
	m.failed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_tls_acme_failures_total",
		Help: "Failed attempts to obtain or renew a certificate from the ACME CA (certmagic retries with backoff).",
	})
	var err error
	if reg != nil {
		var err1, err2, err3 error
		m.obtained, err1 = register(reg, m.obtained)
		m.failed, err2 = register(reg, m.failed)
		_, err3 = register(reg, prometheus.Collector(&acmeExpiry{m: m}))
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	zl := zap.New(&slogCore{log: log})
	var magic atomic.Pointer[certmagic.Config] // set below; the cache's goroutine may ask first
	check := c.CheckInterval
	if check == 0 {
		check = DefaultACMECheckInterval
	}
	ratio := c.RenewWindowRatio
	if ratio == 0 {
		ratio = DefaultACMEWindowRatio
	}
	m.cache = certmagic.NewCache(certmagic.CacheOptions{
		GetConfigForCert: func(certmagic.Certificate) (*certmagic.Config, error) {
			if c := magic.Load(); c != nil {
				return c, nil
			}
			return nil, errors.New("acme: not configured yet")
		},
		RenewCheckInterval: check,
		OCSPCheckInterval:  check,
		Logger:             zl,
	})
	m.magic = certmagic.New(m.cache, certmagic.Config{
		RenewalWindowRatio: ratio,
		DefaultServerName:  strings.ToLower(c.Domains[0]),
		OCSP:               certmagic.OCSPConfig{DisableStapling: c.DisableOCSPStapling},
		Storage:            &certmagic.FileStorage{Path: c.Storage},
		Logger:             zl,
		OnEvent:            m.onEvent,
	})
	magic.Store(m.magic)
	tmpl := certmagic.ACMEIssuer{
		CA:      c.CA,
		Email:   c.Email,
		Agreed:  true,
		Profile: c.Profile,
		Logger:  zl,
		// Only the listeners of this node serve challenges; certmagic's
		// own solver listeners are never needed (see StartACME).
		DisableHTTPChallenge:    !c.challenge(ChallengeHTTP),
		DisableTLSALPNChallenge: !c.challenge(ChallengeTLSALPN),
	}
	if tmpl.CA == "" {
		tmpl.CA = DefaultACMECA
	}
	if c.CARootFile != "" {
		if tmpl.TrustedRoots, err = readRoots(c.CARootFile); err != nil {
			return nil, fmt.Errorf("acme.ca_root_file: %w", err)
		}
	}
	m.issuer = certmagic.NewACMEIssuer(m.magic, tmpl)
	m.magic.Issuers = []certmagic.Issuer{m.issuer}
	return m, nil
}

var acmeExpiryDesc = prometheus.NewDesc("sluice_tls_acme_cert_expiry_timestamp_seconds",
	"NotAfter of the ACME certificate served for each https.acme domain (absent until one is obtained or loaded), in Unix seconds.",
	[]string{"name"}, nil)

// acmeExpiry reports the expiry of the certificates in certmagic's cache
// at scrape time, so renewals show without bookkeeping of ours.
type acmeExpiry struct{ m *acmeManager }

func (e *acmeExpiry) Describe(ch chan<- *prometheus.Desc) { ch <- acmeExpiryDesc }

func (e *acmeExpiry) Collect(ch chan<- prometheus.Metric) {
	for _, d := range e.m.cfg.Domains {
		var latest time.Time
		for _, c := range e.m.cache.AllMatchingCertificates(strings.ToLower(d)) {
			if c.Leaf != nil && c.Leaf.NotAfter.After(latest) {
				latest = c.Leaf.NotAfter
			}
		}
		if !latest.IsZero() {
			ch <- prometheus.MustNewConstMetric(acmeExpiryDesc, prometheus.GaugeValue, float64(latest.Unix()), d)
		}
	}
}

// onEvent counts certificates obtained and failures.
func (m *acmeManager) onEvent(_ context.Context, event string, data map[string]any) error {
	switch event {
	case "cert_obtained":
		renewal, _ := data["renewal"].(bool)
		m.obtained.WithLabelValues(strconv.FormatBool(renewal)).Inc()
		m.log.Info("acme: certificate obtained", "name", data["identifier"], "renewal", renewal)
	case "cert_failed":
		m.failed.Inc()
		m.log.Warn("acme: obtaining a certificate failed", "name", data["identifier"], "renewal", data["renewal"], "err", data["error"])
	}
	return nil
}

// start points certmagic's solvers at the listeners that serve the
// challenges and begins managing the domains in the background (obtain
// what storage lacks, then renew). httpAddr and httpsAddr are the bound
// addresses of the http and https listeners (httpAddr may be empty).
func (m *acmeManager) start(httpAddr, httpsAddr string) {
	m.startOnce.Do(func() {
		// certmagic tries to listen on ListenHost:port for its own solver
		// and, finding the port taken by a listener that accepts, assumes
		// that listener answers the challenge: ours do (GetCertificate for
		// acme-tls/1, HTTPHandler for /.well-known/acme-challenge/).
		if host, port, err := net.SplitHostPort(httpsAddr); err == nil {
			m.issuer.ListenHost = unspecifiedToEmpty(host)
			m.issuer.AltTLSALPNPort, _ = strconv.Atoi(port)
		}
		if _, port, err := net.SplitHostPort(httpAddr); err == nil {
			m.issuer.AltHTTPPort, _ = strconv.Atoi(port)
		} else {
			m.issuer.DisableHTTPChallenge = true
		}
		ctx, cancel := context.WithCancel(context.Background())
		m.cancel = cancel
		if err := m.magic.ManageAsync(ctx, m.cfg.Domains); err != nil {
			m.log.Error("acme: managing certificates", "err", err)
		}
	})
}

func unspecifiedToEmpty(host string) string {
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return ""
	}
	return host
}

// stop ends renewals and OCSP refreshes; certificates already loaded keep
// being served.
func (m *acmeManager) stop() {
	m.stopOnce.Do(func() {
		if m.cancel != nil {
			m.cancel()
		}
		m.cache.Stop()
	})
}

// wants reports whether a handshake is for the ACME side: a TLS-ALPN-01
// validation or a managed name.
func (m *acmeManager) wants(hello *tls.ClientHelloInfo) bool {
	if slices.Contains(hello.SupportedProtos, ALPNACME) {
		return true
	}
	return m.domains[strings.ToLower(strings.TrimSuffix(hello.ServerName, "."))]
}

// StartACME begins obtaining and renewing the https.acme certificates; a
// no-op without ACME. Call it once the listeners accept (the CA validates
// through them): httpAddr and httpsAddr are their bound addresses.
func (s *Store) StartACME(httpAddr, httpsAddr string) {
	if s.acme != nil {
		s.acme.start(httpAddr, httpsAddr)
	}
}

// Close stops the ACME manager's background work (renewals, OCSP); a
// Store without ACME has none. Certificates stay served.
func (s *Store) Close() {
	if s.acme != nil {
		s.acme.stop()
	}
}

// ACMEHTTPHandler returns next wrapped so that HTTP-01 validation requests
// (/.well-known/acme-challenge/...) are answered before anything else; next
// itself without ACME.
func (s *Store) ACMEHTTPHandler(next http.Handler) http.Handler {
	if s == nil || s.acme == nil {
		return next
	}
	return s.acme.issuer.HTTPChallengeHandler(next)
}

// slogCore is a zapcore.Core writing to a *slog.Logger, so that certmagic
// logs where the rest of Sluice does. certmagic's info lines are chatty:
// they go to debug, warnings and errors keep their level.
type slogCore struct {
	log    *slog.Logger
	fields []zapcore.Field
}

func (c *slogCore) Enabled(l zapcore.Level) bool {
	return c.log.Enabled(context.Background(), slogLevel(l))
}

func (c *slogCore) With(f []zapcore.Field) zapcore.Core {
	return &slogCore{log: c.log, fields: append(slices.Clip(c.fields), f...)}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, f []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, x := range c.fields {
		x.AddTo(enc)
	}
	for _, x := range f {
		x.AddTo(enc)
	}
	args := make([]any, 0, 2*len(enc.Fields)+2)
	if e.LoggerName != "" {
		args = append(args, "logger", e.LoggerName)
	}
	for _, k := range slices.Sorted(maps.Keys(enc.Fields)) { // a stable order to read and grep
		args = append(args, k, enc.Fields[k])
	}
	c.log.Log(context.Background(), slogLevel(e.Level), "certmagic: "+e.Message, args...)
	return nil
}

func (c *slogCore) Sync() error { return nil }

func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l >= zapcore.ErrorLevel:
		return slog.LevelError
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	default:
		return slog.LevelDebug
	}
}

// ACMECovers reports whether host is one of the ACME domains (false
// without ACME).
func (c Config) ACMECovers(host string) bool {
	if c.ACME == nil {
		return false
	}
	for _, d := range c.ACME.Domains {
		if strings.EqualFold(strings.TrimSuffix(host, "."), d) {
			return true
		}
	}
	return false
}
