package routing

import (
	"fmt"
	"strings"
	"time"
)

// Traffic classes of a route.
const (
	ClassInteractive = "interactive"
	ClassBatch       = "batch"
)

// RouteConfig matches requests to a pool. It holds only what matching and
// pool selection need; the pipeline's own per-route options live with the
// proxy (proxy.RoutePolicy).
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
	// ServedModels maps public names of Models to the names the pool
	// serves them under (aliases), e.g. gpt-small:
	// meta-llama/Llama-3.1-8B-Instruct. A request for a key is forwarded
	// with the value as its "model", and the value is replaced by the key
	// again in the responses. Routing, limits, metrics and logs use the
	// public name. Nil means every model is served under its public name.
	ServedModels map[string]string `yaml:"served_models"`
	// Pool names the backend pool.
	Pool string `yaml:"pool"`
	// Class is "interactive" (default) or "batch".
	Class string `yaml:"class"`
	// TTFTObjective, when positive, refuses (503, Retry-After) a request
	// whose predicted time to first token misses it on every backend of
	// the pool (see PredictConfig). Zero: no objective.
	TTFTObjective time.Duration `yaml:"ttft_objective"`
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
	// MaxBatch is the engine's batch slots (vLLM --max-num-seqs, SGLang
	// --max-running-requests, TGI max batch size). Zero means unknown: the
	// score is then not normalised by it and queue.target_utilization does
	// not apply to this backend.
	MaxBatch int `yaml:"max_batch"`
	// Dialect overrides the pool's dialect for this backend. Empty means
	// the pool's.
	Dialect string `yaml:"dialect"`
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
	// APIKeyFile names a file holding the api_key instead (read by the
	// configs package on load and reload; docs/OPERATIONS.md "Secrets").
	APIKeyFile string `yaml:"api_key_file"`
	// EjectAfter is how many consecutive failures (connect errors, 5xx)
	// eject a backend. Default 3.
	EjectAfter int `yaml:"eject_after"`
	// EjectFor is the first ejection's length; it doubles with each
	// consecutive ejection up to 16×. Default 2s.
	EjectFor time.Duration `yaml:"eject_for"`
	// Policy picks a backend: "least_queued" (default: power of two
	// choices on the combined load score), "least_request" (power of two
	// choices on this node's in-flight requests), "round_robin" or
	// "random", or "prefix_aware" (the backend likely to hold the
	// prompt's prefix in its KV cache, traded against load: see
	// AffinityConfig). All honour health and max_concurrency; all but
	// prefix_aware honour weights (prefix_aware through the load score).
	Policy string `yaml:"policy"`
	// Dialect names the engines' metrics: "auto" (default: detect from
	// the names exposed), "vllm", "sglang", "tgi", or "none" (do not
	// scrape; use the load header and own in-flight counts only).
	Dialect string `yaml:"dialect"`
	// LoadHeaderFormat asks the backends for an ORCA load report on each
	// response: "text" or "json" sends "endpoint-load-metrics-format:
	// TEXT" (or JSON) with every request, which vLLM (v0.11 and later)
	// answers with an endpoint-load-metrics header on its non-streamed
	// responses; "off" sends nothing. Default ("auto"): text for backends
	// whose dialect is auto, vllm or none, off for sglang and tgi (they
	// do not report load in headers).
	LoadHeaderFormat string `yaml:"load_header_format"`
	// ScrapeInterval is how often each backend's metrics are read.
	// Default 250ms.
	ScrapeInterval time.Duration `yaml:"scrape_interval"`
	// StaleAfter is the age past which a load sample (scraped or from a
	// response header) is ignored and the backend's load counts as unknown:
	// its own in-flight count is used instead. Default 4 × scrape_interval,
	// at least 1s.
	StaleAfter time.Duration `yaml:"stale_after"`
	// Health configures active health probes.
	Health HealthConfig `yaml:"health"`
	// Queue configures the edge admission queue.
	Queue QueueConfig `yaml:"queue"`
	// TLS configures connections to https:// backends. Nil means the
	// system's trusted roots and no client certificate.
	TLS *UpstreamTLS `yaml:"tls"`
	// HTTP2 says whether to speak HTTP/2 to https:// backends: "auto"
	// (default: offered in ALPN, used when the backend picks it), "on"
	// (HTTP/2 only) or "off" (HTTP/1.1 only).
	HTTP2 string `yaml:"http2"`
	// Affinity configures prefix-cache affinity (policy prefix_aware)
	// and session affinity; see AffinityConfig.
	Affinity AffinityConfig `yaml:"affinity"`
	// Predict configures the TTFT prediction (policy predicted_ttft and
	// routes' ttft_objective); see PredictConfig.
	Predict PredictConfig `yaml:"predict"`
	// H2C speaks cleartext HTTP/2 with prior knowledge to http://
	// backends (they must support it). Default false: HTTP/1.1.
	H2C bool `yaml:"h2c"`
	// HTTP1Client picks the client for HTTP/1.1 to http:// backends:
	// "own" (the default, also when empty: Sluice's own client, whose
	// connections a committed stream can hand over) or "net_http" (Go's
	// http.Transport, as before it existed).
	HTTP1Client string `yaml:"http1_client"`
}

// Clients of PoolConfig.HTTP1Client.
const (
	HTTP1ClientOwn     = "own"
	HTTP1ClientNetHTTP = "net_http"
)

// Selection policies (PoolConfig.Policy).
const (
	PolicyLeastQueued  = "least_queued"
	PolicyLeastRequest = "least_request"
	PolicyRoundRobin   = "round_robin"
	PolicyRandom       = "random"
	// PolicyPrefixAware is in affinity.go.
)

// Metric dialects (PoolConfig.Dialect, BackendConfig.Dialect).
const (
	DialectAuto   = "auto"
	DialectVLLM   = "vllm"
	DialectSGLang = "sglang"
	DialectTGI    = "tgi"
	DialectNone   = "none"
)

// Load header formats (PoolConfig.LoadHeaderFormat).
const (
	LoadHeaderAuto = "auto"
	LoadHeaderText = "text"
	LoadHeaderJSON = "json"
	LoadHeaderOff  = "off"
)

// HealthConfig configures a pool's active health probes: a GET of Path on
// every backend each Interval. FailAfter consecutive failures (no answer
// within Timeout, or a status other than 2xx) take the backend out of
// rotation until a probe succeeds again.
type HealthConfig struct {
	// Disable turns active probes off (passive ejection still applies).
	// Default false.
	Disable bool `yaml:"disable"`
	// Path is probed on the backend's base URL. Default "/health".
	Path string `yaml:"path"`
	// Interval between probes of one backend. Default 2s.
	Interval time.Duration `yaml:"interval"`
	// Timeout bounds one probe. Default 1s (and never above Interval).
	Timeout time.Duration `yaml:"timeout"`
	// FailAfter is how many consecutive failed probes take a backend out.
	// Default 2.
	FailAfter int `yaml:"fail_after"`
}

// QueueConfig configures a pool's edge admission queue. A backend is at its
// target when it is at max_concurrency, or its estimated engine queue has
// MaxWaiting requests, or its estimated occupancy reaches
// TargetUtilization of its batch slots. When every healthy backend is at
// target, requests wait at the edge (interactive before batch, FIFO per
// tenant, tenants served round robin) up to MaxWait, then get 503. With
// neither MaxWaiting, TargetUtilization nor any max_concurrency set, nothing
// ever queues.
type QueueConfig struct {
	// MaxWaiting is the target for a backend's engine queue (the waiting
	// gauge, or with max_batch known, occupancy beyond the batch slots).
	// Zero means no such target.
	MaxWaiting int `yaml:"max_waiting"`
	// TargetUtilization is the target occupancy as a fraction of a
	// backend's max_batch slots, e.g. 0.7. Zero means no such target;
	// backends without max_batch are not limited by it.
	TargetUtilization float64 `yaml:"target_utilization"`
	// MaxWait is the longest a request waits in the queue before it is
	// answered 503 with Retry-After. Default 10s.
	MaxWait time.Duration `yaml:"max_queue_wait"`
	// MaxLength bounds the requests waiting in the pool's queue; more are
	// answered 503 at once. Default 1024.
	MaxLength int `yaml:"max_queue_length"`
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
	if c.Policy == "" {
		c.Policy = PolicyLeastQueued
	}
	if c.Dialect == "" {
		c.Dialect = DialectAuto
	}
	if c.LoadHeaderFormat == "" {
		c.LoadHeaderFormat = LoadHeaderAuto
	}
	if c.ScrapeInterval == 0 {
		c.ScrapeInterval = 250 * time.Millisecond
	}
	if c.StaleAfter == 0 {
		c.StaleAfter = max(4*c.ScrapeInterval, time.Second)
	}
	c.Health = c.Health.WithDefaults()
	c.Queue = c.Queue.WithDefaults()
	c.Affinity = c.Affinity.WithDefaults(c.Policy)
	c.Predict = c.Predict.WithDefaults()
	if c.HTTP2 == "" {
		c.HTTP2 = HTTP2Auto
	}
	bs := make([]BackendConfig, len(c.Backends))
	for i, b := range c.Backends {
		if b.Weight == 0 {
			b.Weight = 1
		}
		if b.Dialect == "" {
			b.Dialect = c.Dialect
		}
		bs[i] = b
	}
	c.Backends = bs
	return c
}

// WithDefaults returns c with zero fields set to their defaults.
func (c HealthConfig) WithDefaults() HealthConfig {
	if c.Path == "" {
		c.Path = "/health"
	}
	if c.Interval == 0 {
		c.Interval = 2 * time.Second
	}
	if c.Timeout == 0 {
		c.Timeout = min(time.Second, c.Interval)
	}
	if c.FailAfter == 0 {
		c.FailAfter = 2
	}
	return c
}

// WithDefaults returns c with zero fields set to their defaults.
func (c QueueConfig) WithDefaults() QueueConfig {
	if c.MaxWait == 0 {
		c.MaxWait = 10 * time.Second
	}
	if c.MaxLength == 0 {
		c.MaxLength = 1024
	}
	return c
}

// Validate reports the problems of a pool config (with defaults applied),
// each naming the offending key relative to the pool ("queue.max_waiting").
// Backend URLs are checked by the caller, which knows the simulators.
func (c PoolConfig) Validate() []FieldError {
	var errs []FieldError
	bad := func(key, format string, args ...any) {
		errs = append(errs, FieldError{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	switch c.Policy {
	case PolicyLeastQueued, PolicyLeastRequest, PolicyRoundRobin, PolicyRandom, PolicyPrefixAware, PolicyPredictedTTFT:
	default:
		bad("policy", "policy %q must be least_queued, least_request, round_robin, random, prefix_aware or predicted_ttft", c.Policy)
	}
	errs = append(errs, c.Affinity.validate()...)
	errs = append(errs, c.Predict.validate()...)
	if !validDialect(c.Dialect) {
		bad("dialect", "dialect %q must be auto, vllm, sglang, tgi or none", c.Dialect)
	}
	switch c.LoadHeaderFormat {
	case LoadHeaderAuto, LoadHeaderText, LoadHeaderJSON, LoadHeaderOff:
	default:
		bad("load_header_format", "load_header_format %q must be auto, text, json or off", c.LoadHeaderFormat)
	}
	if c.ScrapeInterval < 10*time.Millisecond {
		bad("scrape_interval", "scrape_interval %v is below the 10ms minimum", c.ScrapeInterval)
	}
	if c.StaleAfter < c.ScrapeInterval {
		bad("stale_after", "stale_after %v must be at least scrape_interval (%v)", c.StaleAfter, c.ScrapeInterval)
	}
	errs = append(errs, c.Health.validate()...)
	errs = append(errs, c.Queue.validate()...)
	slots := 0
	for _, b := range c.Backends {
		if b.MaxBatch > 0 {
			slots++
		}
	}
	if slots > 0 && slots < len(c.Backends) {
		bad("backends", "set max_batch on every backend of the pool or on none (scores compare load per batch slot)")
	}
	if c.Queue.TargetUtilization > 0 && slots == 0 {
		bad("queue.target_utilization", "queue.target_utilization needs the batch slots of the backends: set backends[].max_batch")
	}
	for i, b := range c.Backends {
		key := fmt.Sprintf("backends[%d]", i)
		if b.MaxBatch < 0 {
			bad(key+".max_batch", "max_batch must not be negative")
		}
		if b.Dialect != c.Dialect && !validDialect(b.Dialect) { // an inherited one is reported once
			bad(key+".dialect", "dialect %q must be auto, vllm, sglang, tgi or none", b.Dialect)
		}
	}
	return errs
}

func validDialect(d string) bool {
	switch d {
	case DialectAuto, DialectVLLM, DialectSGLang, DialectTGI, DialectNone:
		return true
	}
	return false
}

func (c HealthConfig) validate() []FieldError {
	var errs []FieldError
	if !strings.HasPrefix(c.Path, "/") {
		errs = append(errs, FieldError{"health.path", fmt.Sprintf("health.path %q must start with /", c.Path)})
	}
	if c.Interval < 10*time.Millisecond {
		errs = append(errs, FieldError{"health.interval", fmt.Sprintf("health.interval %v is below the 10ms minimum", c.Interval)})
	}
	if c.Timeout > c.Interval {
		errs = append(errs, FieldError{"health.timeout", fmt.Sprintf("health.timeout %v must not exceed health.interval %v", c.Timeout, c.Interval)})
	}
	if c.FailAfter < 0 {
		errs = append(errs, FieldError{"health.fail_after", "health.fail_after must not be negative"})
	}
	return errs
}

func (c QueueConfig) validate() []FieldError {
	var errs []FieldError
	if c.MaxWaiting < 0 {
		errs = append(errs, FieldError{"queue.max_waiting", "queue.max_waiting must not be negative"})
	}
	if !(c.TargetUtilization >= 0 && c.TargetUtilization <= 1) {
		errs = append(errs, FieldError{"queue.target_utilization",
			fmt.Sprintf("queue.target_utilization %v must be a fraction in (0, 1], e.g. 0.7", c.TargetUtilization)})
	}
	if c.MaxLength < 0 {
		errs = append(errs, FieldError{"queue.max_queue_length", "queue.max_queue_length must not be negative"})
	}
	return errs
}

// FieldError is one problem with a config key.
type FieldError struct {
	// Key is the key's path relative to the config checked, e.g.
	// "queue.max_waiting" or "backends[2].max_batch".
	Key string
	// Msg describes the problem.
	Msg string
}
