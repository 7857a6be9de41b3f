package configs

import (
	"bytes"
	"cmp"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/internal/gpusim"
	"github.com/sluice-proxy/sluice/internal/units"
	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/proxy/listen"
	"github.com/sluice-proxy/sluice/proxy/tracing"
	"github.com/sluice-proxy/sluice/routing"
	"github.com/sluice-proxy/sluice/tls/certs"
)

//go:embed default.yaml
var defaultYAML []byte

// DefaultName is the file name errors in the embedded default report.
const DefaultName = "<embedded default.yaml>"

// Config is a whole Sluice configuration file.
type Config struct {
	Node      Node                 `yaml:"node"`
	Listeners Listeners            `yaml:"listeners"`
	Proxy     proxy.Config         `yaml:"proxy"`
	Redis     limiter.RedisConfig  `yaml:"redis"`
	Tenants   []proxy.TenantConfig `yaml:"tenants"`
	// TenantsFile names a file holding more tenants (a YAML list with the
	// entries of tenants), relative to this file's directory. It is
	// reloaded on its own when it changes. Empty means none.
	TenantsFile string               `yaml:"tenants_file"`
	Pools       []routing.PoolConfig `yaml:"pools"`
	Routes      []Route              `yaml:"routes"`
	Simulators  []Simulator          `yaml:"simulators"`
	// Tracing exports OpenTelemetry traces over OTLP; off by default
	// (docs/CONFIG.md "tracing").
	Tracing tracing.Config `yaml:"tracing"`

	// Admin secures the admin listener (token, allowed host names).
	Admin Admin `yaml:"admin"`

	// Region shares the tenants' global limits with other edge regions
	// through a global store (docs/CONFIG.md "region"); off by default:
	// the node is single-region.
	Region limiter.RegionConfig `yaml:"region"`

	// File is the path the config was read from.
	File string `yaml:"-"`
	// Version identifies the file's content (see Version).
	Version string `yaml:"-"`
	// Raw is the file's text.
	Raw []byte `yaml:"-"`
	// FileTenants are the tenants read from TenantsFile; nil without one.
	FileTenants *TenantSet `yaml:"-"`
	pos         map[string]Pos
	// secretRefs are the "${env:...}" and "${file:...}" references by
	// path ("pools[1].api_key"), for ResolveSecrets (secrets.go).
	secretRefs map[string]string
}

// Node describes this edge node.
type Node struct {
	// Name identifies the node in logs and metrics. Default: the host name.
	Name string `yaml:"name"`
	// Region is reported to clients in X-Sluice-Region. Default "local".
	Region string `yaml:"region"`
	// DrainTimeout is how long live streams may run on after a shutdown
	// signal before they are cancelled. Default 30s.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// DrainDelay is how long a draining node keeps accepting requests
	// after /readyz starts failing, so that load balancers notice before
	// the listeners close. Zero means none.
	DrainDelay time.Duration `yaml:"drain_delay"`
	// AccessLog sets how the access log's lines are written (off: one
	// write per request). Read at start: changing it needs a restart.
	AccessLog AccessLog `yaml:"access_log"`
}

// AccessLog buffers the access log (nginx's `access_log ... buffer=size
// flush=time`): lines are written together when the buffer is full, when
// the oldest has waited Flush, before any other log line, and on shutdown.
// A crash loses what the buffer holds (docs/CONFIG.md "node").
type AccessLog struct {
	// Buffer is the buffer's size; 0 (the default) writes each line at
	// once. At most 16 MiB.
	Buffer units.Bytes `yaml:"buffer"`
	// Flush is how long a line may wait in the buffer: 1s when a buffer
	// is set and this is zero. At most 1m.
	Flush time.Duration `yaml:"flush"`
}

// MaxAccessLogBuffer bounds node.access_log.buffer.
const MaxAccessLogBuffer = 16 << 20

// Listeners are the addresses Sluice listens on. At least one of HTTP and
// HTTPS must be set.
type Listeners struct {
	// HTTP is a cleartext listener serving HTTP/1.1 and HTTP/2 (h2c).
	// Empty means none.
	HTTP string `yaml:"http"`
	// HTTPProxyProtocol requires a PROXY protocol header (v1 or v2) on
	// every connection of the http listener, accepted only from
	// allowed_cidrs (docs/CONFIG.md "listeners.http_proxy_protocol").
	HTTPProxyProtocol listen.ProxyProtocol `yaml:"http_proxy_protocol"`
	// HTTPS is a TLS listener serving HTTP/1.1 and HTTP/2, with HTTP/3 on
	// the same port number over UDP. Nil means none.
	HTTPS *HTTPS `yaml:"https"`
	// Admin serves /healthz, /readyz and /metrics. Empty means none.
	Admin string `yaml:"admin"`
	// MaxConnsPerAddr caps the TCP connections one client IP address may
	// hold on each proxy listener (http, https); more are closed at once.
	// Zero means 1024.
	MaxConnsPerAddr int `yaml:"max_conns_per_addr"`
	// FirstRequestTimeout closes a TCP connection (h1, h2c, TLS, h2) that
	// has not started a request this long after it was accepted, however
	// it trickles bytes. Zero means 10s.
	FirstRequestTimeout time.Duration `yaml:"first_request_timeout"`
	// IdleTimeout closes a TCP connection (h1 keep-alive, h2) that has
	// served requests and has had none open for this long. Zero means 2m.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// H2Server is the HTTP/2 server of the http (h2c) and https (h2)
	// listeners: "sluice" (Sluice's own, which writes each token from
	// the handler's goroutine) or "go" (net/http's). Empty means
	// "sluice".
	H2Server string `yaml:"h2_server"`
	// TrustedProxies are the L7 proxies (CIDRs or addresses) whose
	// ClientAddressHeader names the client; from any other peer the
	// headers are ignored. Empty means none.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// ClientAddressHeader is the header trusted proxies name the client
	// in: "x-forwarded-for" (default) or "forwarded" (RFC 7239 for=).
	ClientAddressHeader string `yaml:"client_address_header"`
	// HTTPServer is the HTTP/1.1 server of the http listener: "sluice"
	// (Sluice's own, proxy/listen h1serve.go, the default) or "go"
	// (net/http's). Changing it needs a restart (as every listeners key).
	HTTPServer string `yaml:"http_server"`
}

// HTTPS is a TLS listener.
type HTTPS struct {
	// Addr is the listen address, e.g. "0.0.0.0:443".
	Addr         string `yaml:"addr"`
	certs.Config `yaml:",inline"`
	// HTTP3 configures HTTP/3 over QUIC beside the TLS listener (on by
	// default, on the same port number over UDP).
	HTTP3 listen.HTTP3Config `yaml:"http3"`
	// ProxyProtocol requires a PROXY protocol header (v1 or v2) before
	// the TLS handshake, accepted only from allowed_cidrs. HTTP/3 (UDP)
	// has none (docs/OPERATIONS.md).
	ProxyProtocol listen.ProxyProtocol `yaml:"proxy_protocol"`
}

// Route is one entry of routes. Its keys are those of both halves, side by
// side in the same mapping: what routing matches on (name, host, path,
// models, pool, class) and how the proxy treats the requests the route
// matches (kind, allow_query_key, first_token_timeout, retries,
// enforce_limits, hedge_after, timing_comment).
type Route struct {
	routing.RouteConfig `yaml:",inline"`
	proxy.RoutePolicy   `yaml:",inline"`
}

// WithDefaults returns r with both halves' zero fields set to their
// defaults.
func (r Route) WithDefaults() Route {
	r.RouteConfig = r.RouteConfig.WithDefaults()
	r.RoutePolicy = r.RoutePolicy.WithDefaults()
	return r
}

// Simulator is a simulated GPU backend started inside the Sluice process;
// pools refer to it as "sim://NAME".
type Simulator struct {
	// Name is how backends refer to the simulator.
	Name          string `yaml:"name"`
	gpusim.Config `yaml:",inline"`
}

// Default returns the embedded default configuration.
func Default() (*Config, error) { return Parse(DefaultName, defaultYAML) }

// DefaultYAML returns the text of the embedded default configuration.
func DefaultYAML() []byte { return append([]byte(nil), defaultYAML...) }

// Load reads, decodes, defaults and validates a config file and the
// tenants file it names, and checks that its admin.token_file holds a
// token. Every problem is reported as an *Error
// ("file:line:col: message"); use Errors to list them.
func Load(path string) (*Config, error) {
	data, err := ReadFile(path)
	if err != nil {
		return nil, &Error{File: path, Msg: fmt.Sprintf("reading config: %v", err)}
	}
	c, err := Parse(path, data)
	if err != nil {
		return nil, err
	}
	// The admin token is read from disk here (not by Parse: a config
	// fetched from a running node names a file on that node).
	if _, err := c.AdminToken(); err != nil {
		return nil, &Error{File: path, Pos: c.Pos("admin.token_file"), Msg: err.Error()}
	}
	// So are secrets from files and environment variables (secrets.go).
	if err := c.ResolveSecrets(); err != nil {
		return nil, err
	}
	return c, nil
}

// TenantsReader reads the tenants file a config names, given its path
// (tenants_file resolved against the config's directory).
type TenantsReader func(path string) ([]byte, error)

// Parse decodes, defaults and validates config text; name is used in
// errors. A tenants file it names is read from disk. Secrets from files
// and environment variables are not read: they are Redacted until
// ResolveSecrets (Load calls it).
func Parse(name string, data []byte) (*Config, error) {
	return ParseWith(name, data, ReadFile)
}

// ReadFile reads a config or tenants file, but never more than
// MaxFileBytes+1 bytes of it: a larger file is refused by the parser
// ("file is ... bytes or more") without being held in memory whole.
func ReadFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size := int64(MaxFileBytes + 1)
	if fi, err := f.Stat(); err == nil && fi.Size() < size {
		size = fi.Size() + bytes.MinRead // one allocation when the size holds
	}
	var b bytes.Buffer
	b.Grow(int(size))
	_, err = b.ReadFrom(io.LimitReader(f, MaxFileBytes+1))
	return b.Bytes(), err
}

// ParseWith is Parse with the tenants file read by read (for a config
// fetched from a running node, whose tenants file is fetched too).
func ParseWith(name string, data []byte, read TenantsReader) (*Config, error) {
	d := newDecoder(name)
	c := &Config{File: name, Version: Version(data), Raw: data}
	d.parse(data, c)
	c.pos = d.pos
	if len(d.errs) > 0 {
		return nil, errors.Join(d.errs...)
	}
	c.applyDefaults()
	var errs []error
	if c.TenantsFile != "" {
		errs = c.readTenants(read)
	}
	v := &validator{c: c}
	v.validate()
	errs = append(errs, v.errs...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	c.hideSecretRefs() // unknown until ResolveSecrets reads them
	return c, nil
}

// readTenants loads the tenants file; its own problems are reported
// against it (checks across both lists are the validator's).
func (c *Config) readTenants(read TenantsReader) []error {
	path := c.TenantsPath()
	data, err := read(path)
	if err != nil {
		return []error{&Error{File: c.File, Pos: c.Pos("tenants_file"), Msg: fmt.Sprintf("tenants_file: %v", err)}}
	}
	s, err := ParseTenants(path, data)
	if err != nil {
		return []error{err}
	}
	c.FileTenants = s
	return nil
}

func (c *Config) applyDefaults() {
	if c.Node.Name == "" {
		c.Node.Name, _ = os.Hostname()
		if c.Node.Name == "" {
			c.Node.Name = "sluice"
		}
	}
	if c.Node.Region == "" {
		c.Node.Region = "local"
	}
	if c.Node.DrainTimeout == 0 {
		c.Node.DrainTimeout = 30 * time.Second
	}
	if c.Node.AccessLog.Buffer > 0 && c.Node.AccessLog.Flush == 0 {
		c.Node.AccessLog.Flush = time.Second
	}
	c.Proxy = c.Proxy.WithDefaults()
	c.Listeners.MaxConnsPerAddr = cmp.Or(c.Listeners.MaxConnsPerAddr, listen.DefaultMaxConnsPerAddr)
	c.Listeners.FirstRequestTimeout = cmp.Or(c.Listeners.FirstRequestTimeout, listen.DefaultFirstRequestTimeout)
	c.Listeners.IdleTimeout = cmp.Or(c.Listeners.IdleTimeout, listen.DefaultIdleTimeout)
	c.Listeners.ClientAddressHeader = cmp.Or(c.Listeners.ClientAddressHeader, listen.HeaderXForwardedFor)
	c.Listeners.H2Server = cmp.Or(c.Listeners.H2Server, listen.H2ServerSluice)
	c.Listeners.HTTPServer = cmp.Or(c.Listeners.HTTPServer, listen.HTTPServerSluice)
	if c.Listeners.HTTPS != nil {
		c.Listeners.HTTPS.HTTP3 = c.Listeners.HTTPS.HTTP3.WithDefaults()
	}
	if c.Redis.Enabled() {
		c.Redis = c.Redis.WithDefaults()
	}
	c.Region = c.Region.WithDefaults()
	for i := range c.Pools {
		c.Pools[i] = c.Pools[i].WithDefaults()
	}
	for i := range c.Routes {
		c.Routes[i] = c.Routes[i].WithDefaults()
	}
	for i := range c.Simulators {
		c.Simulators[i].Config = c.Simulators[i].Config.WithDefaults()
	}
}

// Pos returns the position of a config path such as "routes[1].pool", or of
// its closest ancestor that was written in the file.
func (c *Config) Pos(path string) Pos {
	for path != "" {
		if p, ok := c.pos[path]; ok {
			return p
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return Pos{Line: 1, Col: 1}
}

// Simulator returns the simulator named name, if any.
func (c *Config) Simulator(name string) (*Simulator, bool) {
	for i := range c.Simulators {
		if c.Simulators[i].Name == name {
			return &c.Simulators[i], true
		}
	}
	return nil, false
}
