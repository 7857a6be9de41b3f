package routing

import "time"

// Traffic classes of a route.
const (
	ClassInteractive = "interactive"
	ClassBatch       = "batch"
)

// Route kinds: how the proxy treats a route's traffic.
const (
	// KindOpenAI is the OpenAI-compatible API: JSON bodies, SSE streams
	// that Sluice parses (usage, tokens, first token).
	KindOpenAI = "openai"
	// KindSSE is any event stream, relayed byte for byte and flushed on
	// arrival.
	KindSSE = "sse"
	// KindWebSocket relays a WebSocket to a backend WebSocket endpoint.
	KindWebSocket = "websocket"
)

// RouteConfig matches requests to a pool.
type RouteConfig struct {
	// Name identifies the route in metrics and logs. Default: the path
	// prefix, with the host when set.
	Name string `yaml:"name"`
	// Host matches the request's host (without port): an exact name or a
	// wildcard "*.example.com". Empty matches any host.
	Host string `yaml:"host"`
	// Path is a path prefix. Default "/v1/".
	Path string `yaml:"path"`
	// Models lists the model names this route serves (the "model" field of
	// the JSON body). Empty matches any model.
	Models []string `yaml:"models"`
	// Pool names the backend pool.
	Pool string `yaml:"pool"`
	// Class is "interactive" (default) or "batch".
	Class string `yaml:"class"`
	// Kind is "openai" (default), "sse" or "websocket".
	Kind string `yaml:"kind"`
	// AllowQueryKey accepts the API key as the query parameter "api_key"
	// (for browsers' EventSource, which cannot set headers). Default false.
	// The parameter is removed before forwarding and redacted in logs.
	AllowQueryKey bool `yaml:"allow_query_key"`
	// FirstTokenTimeout bounds the wait for the first event (or the whole
	// body of a non-streamed response) from one backend. Zero means the
	// proxy's default.
	FirstTokenTimeout time.Duration `yaml:"first_token_timeout"`
	// Retries is how many other backends are tried when one fails before
	// the first token. Nil means the proxy's default (1).
	Retries *int `yaml:"retries"`
	// TimingComment ends every stream with a ": server-timing …" SSE
	// comment carrying the final timing (clients may also ask for it with
	// "X-Sluice-Timing: comment"). Default false.
	TimingComment bool `yaml:"timing_comment"`
}

// BackendConfig is one backend of a pool.
type BackendConfig struct {
	// URL is the backend's base URL, e.g. "http://10.0.0.5:8000". The
	// request path is appended to it. "sim://NAME" names a simulator from
	// the config's simulators section.
	URL string `yaml:"url"`
	// MetricsURL is the backend's Prometheus endpoint. Default: URL + "/metrics".
	MetricsURL string `yaml:"metrics_url"`
	// Weight scales the backend's share. Default 1.
	Weight int `yaml:"weight"`
	// MaxConcurrency caps this node's in-flight requests to the backend.
	// Zero means no cap.
	MaxConcurrency int `yaml:"max_concurrency"`
}

// PoolConfig is a named group of interchangeable backends.
type PoolConfig struct {
	// Name identifies the pool; routes refer to it.
	Name string `yaml:"name"`
	// Backends serve the pool's requests.
	Backends []BackendConfig `yaml:"backends"`
	// APIKey, when set, is sent to the backends as "Authorization: Bearer"
	// (tenants' own keys are never forwarded).
	APIKey string `yaml:"api_key"`
	// EjectAfter is how many consecutive failures (connect errors, 5xx)
	// eject a backend. Default 3.
	EjectAfter int `yaml:"eject_after"`
	// EjectFor is the first ejection's length; it doubles with each
	// consecutive ejection up to 16×. Default 2s.
	EjectFor time.Duration `yaml:"eject_for"`
	// TLS configures connections to https:// backends. Nil means the
	// system's trusted roots and no client certificate.
	TLS *UpstreamTLS `yaml:"tls"`
	// HTTP2 says whether to speak HTTP/2 to https:// backends: "auto"
	// (default: offered in ALPN, used when the backend picks it), "on"
	// (HTTP/2 only) or "off" (HTTP/1.1 only).
	HTTP2 string `yaml:"http2"`
	// H2C speaks cleartext HTTP/2 with prior knowledge to http://
	// backends (they must support it). Default false: HTTP/1.1.
	H2C bool `yaml:"h2c"`
}

// HTTP/2 modes of PoolConfig.HTTP2.
const (
	HTTP2Auto = "auto"
	HTTP2On   = "on"
	HTTP2Off  = "off"
)

// UpstreamTLS configures TLS from the proxy to a pool's https:// backends.
type UpstreamTLS struct {
	// CAFile is a PEM file of the certificate authorities that sign the
	// backends' certificates. Empty means the system's trusted roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are the client certificate and key presented
	// to backends that require one (mutual TLS). Both or neither.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name verified in the backends' certificates (and
	// sent as SNI). Empty means each backend URL's host.
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify accepts any backend certificate. For tests only:
	// it gives up protection against an attacker on the path. Default false.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// WithDefaults returns c with zero fields set to their defaults.
func (c RouteConfig) WithDefaults() RouteConfig {
	if c.Path == "" {
		c.Path = "/v1/"
	}
	if c.Class == "" {
		c.Class = ClassInteractive
	}
	if c.Kind == "" {
		c.Kind = KindOpenAI
	}
	if c.Name == "" {
		c.Name = c.Host + c.Path
	}
	return c
}

// WithDefaults returns c with zero fields set to their defaults.
func (c PoolConfig) WithDefaults() PoolConfig {
	if c.EjectAfter == 0 {
		c.EjectAfter = 3
	}
	if c.EjectFor == 0 {
		c.EjectFor = 2 * time.Second
	}
	if c.HTTP2 == "" {
		c.HTTP2 = HTTP2Auto
	}
	bs := make([]BackendConfig, len(c.Backends))
	for i, b := range c.Backends {
		if b.Weight == 0 {
			b.Weight = 1
		}
		bs[i] = b
	}
	c.Backends = bs
	return c
}
