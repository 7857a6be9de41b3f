package configs

import (
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/proxy/listen"
	"github.com/sluice-proxy/sluice/proxy/ws"
	"github.com/sluice-proxy/sluice/routing"
	"github.com/sluice-proxy/sluice/tls/certs"
)

// validator checks a decoded, defaulted config and reports every problem at
// the position of the entry it is about.
type validator struct {
	c    *Config
	errs []error
}

func (v *validator) errorf(path, format string, args ...any) {
	v.errs = append(v.errs, &Error{File: v.c.File, Pos: v.c.Pos(path), Msg: fmt.Sprintf(format, args...)})
}

func (v *validator) validate() {
	leaves := v.listeners()
	v.admin()
	v.proxy()
	v.simulators()
	pools := v.pools()
	v.routes(pools)
	v.routeHosts(leaves)
	v.tenants()
	v.redis()
	v.region()
	v.tracing()
	v.secrets()
	v.accessLog()
}

// accessLog checks node.access_log: a buffer of at most
// MaxAccessLogBuffer, a flush interval in (0, 1m] and only with a buffer.
func (v *validator) accessLog() {
	a := v.c.Node.AccessLog
	if a.Buffer < 0 || a.Buffer > MaxAccessLogBuffer {
		v.errorf("node.access_log.buffer", "node.access_log.buffer: %s is out of range (0 to 16MiB)", a.Buffer)
	}
	switch {
	case a.Flush < 0 || a.Flush > time.Minute:
		v.errorf("node.access_log.flush", "node.access_log.flush: %s is out of range (up to 1m)", a.Flush)
	case a.Flush > 0 && a.Buffer == 0:
		v.errorf("node.access_log.flush", "node.access_log.flush needs node.access_log.buffer")
	}
}

// tracing checks the tracing section, enabled or not (a typo is found
// before the day it is turned on).
func (v *validator) tracing() {
	if err := v.c.Tracing.Validate(); err != nil {
		for _, e := range unjoin(err) {
			v.errorf("tracing", "tracing: %v", e)
		}
	}
}

func (v *validator) redis() {
	r := v.c.Redis
	if !r.Enabled() {
		if r.Cluster || r.Password != "" || r.PasswordFile != "" || r.Username != "" {
			v.errorf("redis", "redis: addrs is required")
		}
		return
	}
	for i, a := range r.Addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			v.errorf(fmt.Sprintf("redis.addrs[%d]", i), "redis.addrs[%d]: bad address %q (want host:port)", i, a)
		}
	}
	if err := r.Validate(); err != nil {
		for _, e := range unjoin(err) {
			path := "redis"
			if fe, ok := errors.AsType[*limiter.FieldError](e); ok {
				path += "." + fe.Field // at the field's own line:col
			}
			v.errorf(path, "redis: %v", e)
		}
	}
}

// region checks the region section: a global store needs the regional
// Redis (the region's nodes admit against it) and node.region among the
// regions.
func (v *validator) region() {
	rc := v.c.Region
	if rc.Enabled() && !v.c.Redis.Enabled() {
		v.errorf("region.global_store", "region: a global store needs the regional redis section (the region's nodes admit against it)")
	}
	if err := rc.Validate(v.c.Node.Region); err != nil {
		for _, e := range unjoin(err) {
			path := "region"
			if fe, ok := errors.AsType[*limiter.FieldError](e); ok {
				path += "." + fe.Field
			}
			v.errorf(path, "region: %v", e)
		}
	}
}

// unjoin splits an errors.Join result into its parts.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func (v *validator) addr(path, addr string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		v.errorf(path, "%s: bad listen address %q (want host:port, e.g. \"127.0.0.1:8080\")", path, addr)
		return
	}
	if host != "" && net.ParseIP(host) == nil && host != "localhost" {
		v.errorf(path, "%s: listen host %q must be an IP address or localhost", path, host)
	}
}

// clientAddress checks the PROXY protocol and trusted proxy settings.
func (v *validator) clientAddress(l Listeners) {
	v.proxyProtocol("listeners.http_proxy_protocol", l.HTTPProxyProtocol, l.HTTP != "")
	if l.HTTPS != nil {
		v.proxyProtocol("listeners.https.proxy_protocol", l.HTTPS.ProxyProtocol, true)
	}
	if _, err := listen.ParsePrefixes(l.TrustedProxies); err != nil {
		v.errorf("listeners.trusted_proxies", "listeners.trusted_proxies: %v", err)
	}
	switch l.H2Server {
	case listen.H2ServerGo, listen.H2ServerSluice:
	default:
		v.errorf("listeners.h2_server", "listeners.h2_server: %q is not %q or %q", l.H2Server, listen.H2ServerGo, listen.H2ServerSluice)
	}
	switch l.ClientAddressHeader {
	case listen.HeaderXForwardedFor, listen.HeaderForwarded:
	default:
		v.errorf("listeners.client_address_header", "listeners.client_address_header: %q is not %q or %q",
			l.ClientAddressHeader, listen.HeaderXForwardedFor, listen.HeaderForwarded)
	}
	if !listen.ValidHTTPServer(l.HTTPServer) {
		v.errorf("listeners.http_server", "listeners.http_server: %q is not %q or %q",
			l.HTTPServer, listen.HTTPServerGo, listen.HTTPServerSluice)
	}
}

func (v *validator) proxyProtocol(path string, p listen.ProxyProtocol, listener bool) {
	if !p.Enabled {
		return
	}
	if !listener {
		v.errorf(path, "%s: enabled, but the listener is not set", path)
	}
	if len(p.AllowedCIDRs) == 0 {
		v.errorf(path, "%s: enabled needs allowed_cidrs (the load balancers' addresses; connections from elsewhere are refused)", path)
	}
	if _, err := p.Prefixes(); err != nil {
		v.errorf(path+".allowed_cidrs", "%s.allowed_cidrs: %v", path, err)
	}
}

// listeners checks the listeners; it returns the leaf certificates of the
// HTTPS listener's pairs when every one of them loaded.
func (v *validator) listeners() []*x509.Certificate {
	l := v.c.Listeners
	if l.HTTP == "" && l.HTTPS == nil {
		v.errorf("listeners", "listeners: set at least one of http or https")
	}
	if l.HTTP != "" {
		v.addr("listeners.http", l.HTTP)
	}
	if l.Admin != "" {
		v.addr("listeners.admin", l.Admin)
	}
	if l.MaxConnsPerAddr < 1 {
		v.errorf("listeners.max_conns_per_addr", "listeners.max_conns_per_addr: %d must be at least 1", l.MaxConnsPerAddr)
	}
	if l.FirstRequestTimeout < 100*time.Millisecond {
		v.errorf("listeners.first_request_timeout", "listeners.first_request_timeout: %v is too short (at least 100ms)", l.FirstRequestTimeout)
	}
	if l.IdleTimeout < 100*time.Millisecond {
		v.errorf("listeners.idle_timeout", "listeners.idle_timeout: %v is too short (at least 100ms)", l.IdleTimeout)
	}
	v.clientAddress(l)
	if s := l.HTTPS; s != nil {
		if s.Addr == "" {
			v.errorf("listeners.https", "listeners.https: addr is required")
		} else {
			v.addr("listeners.https.addr", s.Addr)
		}
		if !s.DevCert && len(s.Certificates) == 0 && s.ACME == nil {
			v.errorf("listeners.https", "listeners.https: set certificates (cert_file, key_file), acme or dev_cert: true")
		}
		if s.ACME != nil {
			for _, fe := range s.ACME.Check(l.HTTP != "") {
				v.errorf("listeners.https.acme."+fe.Key, "listeners.https.%s", fe.Msg)
			}
		}
		switch s.MinVersion {
		case "", "1.2", "1.3":
		default:
			v.errorf("listeners.https.min_version", "listeners.https.min_version: %q is not supported (use \"1.2\" or \"1.3\")", s.MinVersion)
		}
		v.http3(s)
		return v.certificates(s)
	}
	return nil
}

func (v *validator) http3(s *HTTPS) {
	h := s.HTTP3
	if !h.On() {
		return
	}
	if h.Addr != "" {
		v.addr("listeners.https.http3.addr", h.Addr)
	}
	if h.MaxIncomingStreams < 0 || h.MaxIncomingStreams > 1<<20 {
		v.errorf("listeners.https.http3.max_incoming_streams",
			"listeners.https.http3.max_incoming_streams: %d is out of range (1 to 1048576)", h.MaxIncomingStreams)
	}
	if h.IdleTimeout < time.Second {
		v.errorf("listeners.https.http3.idle_timeout", "listeners.https.http3.idle_timeout: %v is too short (at least 1s)", h.IdleTimeout)
	}
	if h.MaxConnsPerAddr < 1 {
		v.errorf("listeners.https.http3.max_conns_per_addr", "listeners.https.http3.max_conns_per_addr: %d must be at least 1", h.MaxConnsPerAddr)
	}
	if h.MaxHandshakes < 2 {
		v.errorf("listeners.https.http3.max_handshakes", "listeners.https.http3.max_handshakes: %d must be at least 2", h.MaxHandshakes)
	}
	if h.MaxHandshakesPerAddr < 1 {
		v.errorf("listeners.https.http3.max_handshakes_per_addr", "listeners.https.http3.max_handshakes_per_addr: %d must be at least 1", h.MaxHandshakesPerAddr)
	}
}

func (v *validator) proxy() {
	p := v.c.Proxy
	if *p.Retries < 0 {
		v.errorf("proxy.retries", "proxy.retries: must not be negative")
	}
	if p.MaxBodyBytes <= 0 {
		v.errorf("proxy.max_body_bytes", "proxy.max_body_bytes: must be positive")
	}
	v.websocket(p.WebSocket)
}

func (v *validator) websocket(w ws.Config) {
	const path = "proxy.websocket"
	if !strings.HasPrefix(w.Path, "/") {
		v.errorf(path+".path", "%s.path: %q must start with /", path, w.Path)
	}
	for _, f := range []struct {
		key string
		n   int64
	}{{"max_inflight", int64(w.MaxInflight)}, {"send_queue", int64(w.SendQueue)},
		{"max_message_bytes", int64(w.MaxMessageBytes)}, {"request_burst", int64(w.RequestBurst)},
		{"max_sockets_per_addr", int64(w.MaxSocketsPerAddr)}, {"max_sockets_per_tenant", int64(w.MaxSocketsPerTenant)}} {
		if f.n < 0 {
			v.errorf(path+"."+f.key, "%s.%s: must not be negative", path, f.key)
		}
	}
	if w.RequestRate < 0 {
		v.errorf(path+".request_rate", "%s.request_rate: must not be negative", path)
	}
	for i, o := range w.AllowedOrigins {
		if !ws.ValidOrigin(o) {
			v.errorf(fmt.Sprintf("%s.allowed_origins[%d]", path, i),
				"%s.allowed_origins[%d]: %q is not an origin (want \"*\" or scheme://host[:port], e.g. \"https://app.example.com\" or \"https://*.example.com\")",
				path, i, o)
		}
	}
}

// uniqueName checks that an entry's name is set and not taken, and takes it.
func (v *validator) uniqueName(path, kind, name string, seen map[string]bool) {
	switch {
	case name == "":
		v.errorf(path, "%s: name is required", path)
	case seen[name]:
		v.errorf(path+".name", "%s: duplicate %s name %q", path, kind, name)
	}
	seen[name] = true
}

func (v *validator) simulators() {
	seen := map[string]bool{}
	for i, s := range v.c.Simulators {
		path := fmt.Sprintf("simulators[%d]", i)
		v.uniqueName(path, "simulator", s.Name, seen)
		if err := s.Config.Validate(); err != nil {
			v.errorf(path, "%s: %v", path, err)
		}
	}
}

func (v *validator) pools() map[string]bool {
	names := map[string]bool{}
	for i, p := range v.c.Pools {
		path := fmt.Sprintf("pools[%d]", i)
		v.uniqueName(path, "pool", p.Name, names)
		if len(p.Backends) == 0 {
			v.errorf(path, "pool %q: at least one backend is required", p.Name)
		}
		if p.EjectAfter < 0 {
			v.errorf(path+".eject_after", "pool %q: eject_after must not be negative", p.Name)
		}
		for _, fe := range p.Validate() {
			v.errorf(path+"."+fe.Key, "pool %q: %s", p.Name, fe.Msg)
		}
		for j, b := range p.Backends {
			v.backend(fmt.Sprintf("%s.backends[%d]", path, j), b)
		}
		v.upstream(path, p)
	}
	return names
}

// upstream checks a pool's HTTP/2 and HTTP/1.1 client choices and
// upstream TLS files.
func (v *validator) upstream(path string, p routing.PoolConfig) {
	switch p.HTTP2 {
	case routing.HTTP2Auto, routing.HTTP2On, routing.HTTP2Off:
	default:
		v.errorf(path+".http2", "pool %q: http2 %q must be auto, on or off", p.Name, p.HTTP2)
	}
	switch p.HTTP1Client {
	case "", routing.HTTP1ClientOwn, routing.HTTP1ClientNetHTTP:
	default:
		v.errorf(path+".http1_client", "pool %q: http1_client %q must be own or net_http", p.Name, p.HTTP1Client)
	}
	if p.H2C && p.HTTP2 == routing.HTTP2Off {
		v.errorf(path+".h2c", "pool %q: h2c needs http2 auto or on, not off", p.Name)
	}
	t := p.TLS
	if t == nil {
		return
	}
	tp := path + ".tls"
	if !hasHTTPSBackend(p) {
		v.errorf(tp, "pool %q: tls is set but no backend url is https://", p.Name)
	}
	if t.CAFile != "" {
		if _, err := proxy.LoadCAFile(t.CAFile); err != nil {
			v.errorf(tp+".ca_file", "pool %q: %v", p.Name, err)
		}
	}
	switch {
	case t.CertFile != "" && t.KeyFile != "":
		pair := certs.Pair{CertFile: t.CertFile, KeyFile: t.KeyFile}
		if _, err := certs.CheckPair(pair, time.Now()); err != nil {
			v.errorf(tp+".cert_file", "pool %q: client certificate: %v", p.Name, err)
		}
	case t.CertFile != "":
		v.errorf(tp+".cert_file", "pool %q: tls.cert_file needs tls.key_file", p.Name)
	case t.KeyFile != "":
		v.errorf(tp+".key_file", "pool %q: tls.key_file needs tls.cert_file", p.Name)
	}
}

func hasHTTPSBackend(p routing.PoolConfig) bool {
	for _, b := range p.Backends {
		if strings.HasPrefix(b.URL, "https://") {
			return true
		}
	}
	return false
}

func (v *validator) backend(path string, b routing.BackendConfig) {
	u, err := url.Parse(b.URL)
	switch {
	case b.URL == "":
		v.errorf(path, "%s: url is required", path)
	case err != nil || u.Host == "":
		v.errorf(path+".url", "%s: bad backend url %q", path, b.URL)
	case u.Scheme == "sim":
		if _, ok := v.c.Simulator(u.Host); !ok {
			v.errorf(path+".url", "%s: no simulator named %q in simulators", path, u.Host)
		}
	case u.Scheme != "http" && u.Scheme != "https":
		v.errorf(path+".url", "%s: backend url scheme must be http, https or sim, not %q", path, u.Scheme)
	}
	if b.MetricsURL != "" {
		if u, err := url.Parse(b.MetricsURL); err != nil || u.Host == "" {
			v.errorf(path+".metrics_url", "%s: bad metrics url %q", path, b.MetricsURL)
		}
	}
	if b.Weight < 0 || b.MaxConcurrency < 0 {
		v.errorf(path, "%s: weight and max_concurrency must not be negative", path)
	}
}

func (v *validator) routes(pools map[string]bool) {
	seen := map[string]int{}
	for i, r := range v.c.Routes {
		path := fmt.Sprintf("routes[%d]", i)
		switch {
		case r.Pool == "":
			v.errorf(path, "%s: pool is required", path)
		case !pools[r.Pool]:
			v.errorf(path+".pool", "%s: pool %q is not defined in pools", path, r.Pool)
		}
		if !strings.HasPrefix(r.Path, "/") {
			v.errorf(path+".path", "%s: path %q must start with /", path, r.Path)
		}
		if r.Host != "" && (strings.ContainsAny(r.Host, ":/ ") || strings.Contains(r.Host[1:], "*")) {
			v.errorf(path+".host", "%s: bad host %q (a name or *.name, without port)", path, r.Host)
		}
		if r.Class != routing.ClassInteractive && r.Class != routing.ClassBatch {
			v.errorf(path+".class", "%s: class %q must be interactive or batch", path, r.Class)
		}
		if r.TTFTObjective < 0 || r.TTFTObjective > 10*time.Minute {
			v.errorf(path+".ttft_objective", "%s: ttft_objective %s must be from 0 (none) to 10m", path, r.TTFTObjective)
		}
		v.routePolicy(path, r)
		v.routeModels(path, r)
		key := r.Host + " " + r.Path + " " + strings.Join(r.Models, ",")
		if j, dup := seen[key]; dup {
			v.errorf(path, "%s: same host, path and models as routes[%d]", path, j)
		}
		seen[key] = i
	}
	v.aliasCollisions()
}

// routeModels checks route r's model names and aliases (served_models):
// no empty name, every alias a public name of the route's models, served
// under another, non-empty name, on a route whose bodies are read.
func (v *validator) routeModels(path string, r Route) {
	for i, m := range r.Models {
		if strings.TrimSpace(m) == "" {
			v.errorf(fmt.Sprintf("%s.models[%d]", path, i), "%s.models[%d]: empty model name", path, i)
		}
	}
	if len(r.ServedModels) == 0 {
		return
	}
	if r.Kind != proxy.KindOpenAI {
		v.errorf(path+".served_models", "%s: served_models needs kind openai (the model is rewritten in the JSON body)", path)
		return
	}
	for _, pub := range slices.Sorted(maps.Keys(r.ServedModels)) {
		served := r.ServedModels[pub]
		key := path + ".served_models." + pub
		switch {
		case strings.TrimSpace(pub) == "":
			v.errorf(path+".served_models", "%s.served_models: empty public model name", path)
		case !slices.Contains(r.Models, pub):
			v.errorf(key, "%s.served_models: %q is not one of the route's models; list the public name in models", path, pub)
		case strings.TrimSpace(served) == "":
			v.errorf(key, "%s.served_models: %q maps to an empty served name", path, pub)
		case served == pub:
			v.errorf(key, "%s.served_models: %q maps to itself; remove the entry", path, pub)
		}
	}
}

// aliasCollisions refuses a public name that one route serves under
// another name (an alias) while another route that can match the same
// requests (same host, one path a prefix of the other) lists it too: the
// name would mean a different model depending on the path, or one of the
// routes would never see it.
func (v *validator) aliasCollisions() {
	rs := v.c.Routes
	for i, a := range rs {
		for _, pub := range slices.Sorted(maps.Keys(a.ServedModels)) {
			for j, b := range rs {
				if i == j || !strings.EqualFold(a.Host, b.Host) ||
					!(strings.HasPrefix(a.Path, b.Path) || strings.HasPrefix(b.Path, a.Path)) ||
					!slices.Contains(b.Models, pub) {
					continue
				}
				if j < i && len(b.ServedModels[pub]) > 0 {
					continue // reported from routes[j]
				}
				v.errorf(fmt.Sprintf("routes[%d].models", j), "routes[%d]: model %q is an alias of routes[%d] (served as %q); a public name must name one model on a host and path",
					j, pub, i, a.ServedModels[pub])
			}
		}
	}
}

// routePolicy checks the keys of route r (at path) that the proxy owns,
// in the order they were always reported: kind (and what a websocket route
// cannot have), the bridge's path, then the rest of the policy.
func (v *validator) routePolicy(path string, r Route) {
	errs := r.RoutePolicy.Validate(v.c.Proxy)
	if len(errs) > 0 && errs[0].Key == "kind" {
		v.errorf(path+".kind", "%s: %s", path, errs[0].Msg)
		errs = errs[1:]
	}
	if r.Kind == proxy.KindWebSocket && len(r.Models) > 0 {
		v.errorf(path+".models", "%s: a websocket route cannot match models (it has no request body)", path)
	}
	if ws := v.c.Proxy.WebSocket; *ws.Enabled && r.Path == ws.Path {
		v.errorf(path+".path", "%s: path %q is the WebSocket bridge endpoint (proxy.websocket.path); choose another", path, r.Path)
	}
	for _, fe := range errs {
		v.errorf(path+"."+fe.Key, "%s: %s", path, fe.Msg)
	}
}

// tenants checks the inline tenants, and them against the tenants file's
// (which ParseTenants checked on its own).
func (v *validator) tenants() {
	v.errs = append(v.errs, validateTenants(v.c.inlineTenants())...)
	if s := v.c.FileTenants; s != nil {
		v.errs = append(v.errs, crossCheckTenants(v.c.inlineTenants(), s.source())...)
	}
}

// validKeyHash reports whether k is "sha256:" and 64 hex digits.
func validKeyHash(k string) bool {
	h, ok := strings.CutPrefix(k, "sha256:")
	if !ok || len(h) != 64 {
		return false
	}
	for i := 0; i < len(h); i++ {
		if !isHex[h[i]] {
			return false
		}
	}
	return true
}

var isHex = func() (t [256]bool) {
	for _, c := range "0123456789abcdefABCDEF" {
		t[c] = true
	}
	return t
}()

func (v *validator) limits(path string, l limiter.Limits) {
	if err := l.Validate(); err != nil {
		for _, e := range unjoin(err) {
			v.errorf(path, "%s: %v", path, e)
		}
	}
}

// certificates checks each pair's files and returns their leaves, or nil
// if any pair failed.
func (v *validator) certificates(s *HTTPS) []*x509.Certificate {
	var leaves []*x509.Certificate
	ok := true
	for i, p := range s.Certificates {
		path := fmt.Sprintf("listeners.https.certificates[%d]", i)
		if p.CertFile == "" || p.KeyFile == "" {
			v.errorf(path, "%s: cert_file and key_file are required", path)
			ok = false
			continue
		}
		leaf, err := certs.CheckPair(p, time.Now())
		if err != nil {
			v.errorf(path, "%s: %v", path, err)
			ok = false
			continue
		}
		leaves = append(leaves, leaf)
	}
	if !ok {
		return nil
	}
	return leaves
}

// routeHosts checks that a certificate of the HTTPS listener covers every
// route's host, so that clients do not fail verification. The development
// certificate (localhost only) turns the check off, as do certificates
// that failed to load (already reported).
func (v *validator) routeHosts(leaves []*x509.Certificate) {
	s := v.c.Listeners.HTTPS
	if s == nil || s.DevCert || len(leaves) == 0 {
		return
	}
	for i, r := range v.c.Routes {
		if r.Host != "" && !certs.Covers(leaves, r.Host) && !s.ACMECovers(r.Host) {
			path := fmt.Sprintf("routes[%d].host", i)
			v.errorf(path, "routes[%d]: no certificate of listeners.https covers host %q", i, r.Host)
		}
	}
}
