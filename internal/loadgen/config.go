package loadgen

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Protocol is the wire protocol used to reach a target.
type Protocol string

// Protocols understood by the load generator.
const (
	// H1 is HTTP/1.1 over TCP, with TLS for https URLs.
	H1 Protocol = "h1"
	// H2 is HTTP/2 over TLS, negotiated with ALPN (https URLs only).
	H2 Protocol = "h2"
	// H2C is cleartext HTTP/2 with prior knowledge (http URLs only).
	H2C Protocol = "h2c"
	// H3 is HTTP/3 over QUIC (https URLs only), one QUIC connection per
	// target. Requests beyond the server's concurrent-stream limit
	// (quic-go's default is 100) wait on the client for a stream, and that
	// wait counts in TTFT: raise the server's limit above the concurrency.
	H3 Protocol = "h3"
	// WS is the Sluice WebSocket bridge: JSON request frames on one socket,
	// answered by chunk, done and error frames.
	WS Protocol = "ws"
)

// String returns the protocol name.
func (p Protocol) String() string { return string(p) }

// Set parses a protocol name; it implements flag.Value.
func (p *Protocol) Set(s string) error {
	switch v := Protocol(strings.ToLower(strings.TrimSpace(s))); v {
	case H1, H2, H2C, H3, WS:
		*p = v
		return nil
	case "http1", "http/1.1":
		*p = H1
		return nil
	}
	return fmt.Errorf("unknown protocol %q (want h1, h2, h2c, h3 or ws)", s)
}

// Config is one load-generator run. The zero value plus a Target is a valid
// run: 30 s of the chat workload at concurrency 1 over HTTP/1.1. Every field
// has a flag (see RegisterFlags); zero fields take the documented default.
type Config struct {
	// Target is the base URL of an OpenAI-compatible server, e.g.
	// http://127.0.0.1:8080 or https://edge.example.com. Path is appended
	// to it. For the WS protocol, ws:// and wss:// URLs are used as the
	// socket URL as is; http(s) URLs get WSPath appended instead.
	Target string
	// Compare, when set, is a second target, the baseline: the same
	// workload runs against Target and Compare in alternating rounds and
	// the report gives each percentile of Target as a ratio to and a delay
	// over Compare. Empty means no comparison.
	Compare string
	// Protocol is how Target is reached. Empty means H1.
	Protocol Protocol
	// CompareProtocol is how Compare is reached. Empty means Protocol.
	CompareProtocol Protocol
	// NoKeepAlive makes the target's client (not the baseline's) open a
	// new connection for every request (HTTP/1.1 and HTTP/2 over TCP).
	// Compared with the same server as the baseline, the deltas are what
	// a client pays when its connection is not kept alive.
	NoKeepAlive bool
	// Path is the endpoint path. Empty means /v1/chat/completions. A path
	// ending in /completions but not chat/completions gets a "prompt"
	// body instead of "messages".
	Path string
	// WSPath is the WebSocket bridge path appended to an http(s) Target.
	// Empty means /v1/ws.
	WSPath string
	// WSConns is how many WebSocket sockets carry the requests (assigned
	// round-robin, several in flight on each). Zero means 1.
	WSConns int
	// APIKey is sent as "Authorization: Bearer <key>". Empty sends none.
	APIKey string
	// Model is the model field of every request. Empty means "sim-small".
	Model string
	// NoStream asks for non-streamed responses (stream: false). By
	// default requests stream with stream_options.include_usage.
	NoStream bool
	// IgnoreEOS adds "ignore_eos": true so engines that support it
	// (vLLM, SGLang) produce exactly max_tokens tokens.
	IgnoreEOS bool
	// Headers are extra request headers, each "Name: value".
	Headers []string

	// Insecure skips TLS certificate verification.
	Insecure bool
	// CAFile is a PEM file of CA certificates trusted instead of the
	// system roots. Empty uses the system roots.
	CAFile string
	// PinSHA256 is the base64 (or hex) SHA-256 of the server's
	// SubjectPublicKeyInfo. When set it replaces chain verification: the
	// leaf key must match the pin (useful for a self-signed dev
	// certificate).
	PinSHA256 string

	// Workload is chat, translate, batch or custom. Empty means chat.
	// See the Workload* constants for the length distributions.
	Workload string
	// PromptTokens and OutputTokens override the workload's prompt and
	// output length distributions; both are required for custom. The zero
	// Dist means "use the workload's".
	PromptTokens Dist
	OutputTokens Dist
	// Seed seeds the length distributions, prompt text and Poisson
	// arrivals. Zero means 1.
	Seed int64

	// Concurrency is the number of closed-loop workers, each sending its
	// next request when the previous one ends. Zero means 1. Ignored when
	// Rate is set.
	Concurrency int
	// Rate, when > 0, selects an open loop: Poisson arrivals at Rate
	// requests per second, scheduled independently of completions.
	Rate float64
	// Duration bounds the measured phase (after Warmup): no request starts
	// after it. Requests bounds the number of measured requests. Both are
	// honoured when both are set (whichever ends first); when both are
	// zero Duration is 30 s.
	Duration time.Duration
	Requests int
	// Warmup runs the same load for this long before measuring; requests
	// started during it are not reported. Zero means no warm-up.
	Warmup time.Duration
	// Ramp spreads the start of the closed-loop workers evenly over this
	// long (worker i of n starts at i × Ramp / n), so thousands of streams
	// do not connect in the same millisecond. Requests started during the
	// ramp are warm-up in every phase (every round of a comparison, every
	// point of a sweep): they are not measured, and the measured duration
	// starts after max(Ramp, Warmup). Zero starts every worker at once.
	// Closed loop only. As only requests started after the ramp are
	// measured, the first request of every worker is not: with streams
	// longer than the ramp, make Duration longer than one stream.
	Ramp time.Duration
	// Timeout bounds each request (send to end of stream). Zero means 5 min.
	Timeout time.Duration
	// Drain is how long requests still in flight when the run ends may
	// take to finish before they are cancelled (and counted as canceled,
	// not truncated). Zero means 60 s.
	Drain time.Duration
	// MaxInFlight caps open-loop requests in flight; arrivals beyond it are
	// not sent and are counted as dropped (so the generator never becomes
	// the queue). Zero means 10,000.
	MaxInFlight int

	// Rounds is, in compare mode, the number of rounds per target; the
	// budget (Duration, Requests) of each target is split evenly among
	// them and rounds alternate A B B A A B … so drift hits both equally.
	// Zero means 4.
	Rounds int
	// PIDs are processes whose CPU time (utime+stime from /proc/<pid>/stat)
	// is read before and after each round and reported per 1,000 output
	// tokens of the target measured in that round.
	PIDs []int

	// Sweep, when set, runs one bounded measurement per value of
	// concurrency or rate (see Sweep). Zero means no sweep.
	Sweep SweepSpec

	// JSON, CSV, RequestsCSV and SVG are output files ("-" means stdout)
	// written by Execute: the report as JSON, the report (or sweep
	// points) as CSV, one CSV row per request, and the sweep curve as SVG.
	// Empty writes nothing.
	JSON        string
	CSV         string
	RequestsCSV string
	SVG         string
	// Progress is auto (a live line on stderr when it is a terminal),
	// always or never. Empty means auto.
	Progress string

	// label names the run in the progress line (set by Sweep).
	label string
}

// Defaults for zero Config fields.
const (
	DefaultPath        = "/v1/chat/completions"
	DefaultWSPath      = "/v1/ws"
	DefaultModel       = "sim-small"
	DefaultDuration    = 30 * time.Second
	DefaultTimeout     = 5 * time.Minute
	DefaultDrain       = 60 * time.Second
	DefaultMaxInFlight = 10000
	DefaultRounds      = 4
)

// withDefaults returns c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	setDefault(&c.Protocol, H1)
	setDefault(&c.CompareProtocol, c.Protocol)
	setDefault(&c.Path, DefaultPath)
	setDefault(&c.WSPath, DefaultWSPath)
	setDefault(&c.Model, DefaultModel)
	setDefault(&c.Workload, WorkloadChat)
	setDefault(&c.Progress, "auto")
	setDefault(&c.WSConns, 1)
	setDefault(&c.Seed, 1)
	setDefault(&c.Concurrency, 1)
	setDefault(&c.Timeout, DefaultTimeout)
	setDefault(&c.Drain, DefaultDrain)
	setDefault(&c.MaxInFlight, DefaultMaxInFlight)
	setDefault(&c.Rounds, DefaultRounds)
	if c.Duration == 0 && c.Requests == 0 {
		c.Duration = DefaultDuration
	}
	return c
}

func setDefault[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}

// Validate reports every problem with c (after defaults), joined.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if err := checkTarget(c.Target, c.Protocol); err != nil {
		add("target: %w", err)
	}
	if c.Compare != "" {
		if err := checkTarget(c.Compare, c.CompareProtocol); err != nil {
			add("compare: %w", err)
		}
		if c.Sweep.Kind != "" {
			add("sweep and compare cannot be combined")
		}
	}
	if !strings.HasPrefix(c.Path, "/") {
		add("path %q must start with /", c.Path)
	}
	if _, err := newWorkload(c); err != nil {
		add("workload: %w", err)
	}
	if c.Concurrency < 0 || c.Rate < 0 || c.Requests < 0 || c.Duration < 0 || c.Warmup < 0 {
		add("concurrency, rate, requests, duration and warmup must not be negative")
	}
	if c.Timeout < 0 || c.Drain < 0 || c.MaxInFlight < 0 || c.Rounds < 0 || c.WSConns < 0 || c.Ramp < 0 {
		add("timeout, drain, max-inflight, rounds, ws-conns and ramp must not be negative")
	}
	if c.Ramp > 0 && (c.Rate > 0 || c.Sweep.Kind == SweepRate) {
		add("ramp applies to the closed loop (concurrency), not to an open loop (rate)")
	}
	for _, h := range c.Headers {
		if name, _, ok := strings.Cut(h, ":"); !ok || strings.TrimSpace(name) == "" {
			add("header %q is not \"Name: value\"", h)
		}
	}
	if c.PinSHA256 != "" {
		if _, err := decodePin(c.PinSHA256); err != nil {
			add("pin: %w", err)
		}
	}
	switch c.Progress {
	case "auto", "always", "never":
	default:
		add("progress %q: want auto, always or never", c.Progress)
	}
	for _, pid := range c.PIDs {
		if pid <= 0 {
			add("pid %d is not a process id", pid)
		}
	}
	return errors.Join(errs...)
}

func checkTarget(raw string, p Protocol) error {
	if raw == "" {
		return errors.New("no URL")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("parsing %q: %w", raw, err)
	}
	if u.Host == "" {
		return fmt.Errorf("%q has no host", raw)
	}
	ok := map[Protocol][]string{
		H1:  {"http", "https"},
		H2:  {"https"},
		H2C: {"http"},
		H3:  {"https"},
		WS:  {"http", "https", "ws", "wss"},
	}[p]
	for _, s := range ok {
		if u.Scheme == s {
			return nil
		}
	}
	return fmt.Errorf("protocol %s needs a %s URL, got %q", p, strings.Join(ok, " or "), raw)
}

// RegisterFlags binds every field of c to a flag of fs, with c's current
// values as the defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Target, "target", c.Target, "base `URL` of the OpenAI-compatible target")
	fs.StringVar(&c.Compare, "compare", c.Compare, "baseline `URL` measured interleaved with the target")
	fs.Var(&c.Protocol, "protocol", "target protocol: h1, h2, h2c, h3 or ws (default h1)")
	fs.Var(&c.CompareProtocol, "compare-protocol", "baseline protocol (default: same as -protocol)")
	fs.BoolVar(&c.NoKeepAlive, "no-keepalive", c.NoKeepAlive, "a new connection for every request to the target (not the baseline)")
	fs.StringVar(&c.Path, "path", c.Path, "endpoint path (default "+DefaultPath+")")
	fs.StringVar(&c.WSPath, "ws-path", c.WSPath, "WebSocket bridge path for http(s) targets (default "+DefaultWSPath+")")
	fs.IntVar(&c.WSConns, "ws-conns", c.WSConns, "WebSocket sockets carrying the requests (default 1)")
	fs.StringVar(&c.APIKey, "api-key", c.APIKey, "API key sent as a bearer token")
	fs.StringVar(&c.Model, "model", c.Model, "model name (default "+DefaultModel+")")
	fs.BoolVar(&c.NoStream, "no-stream", c.NoStream, "ask for non-streamed responses")
	fs.BoolVar(&c.IgnoreEOS, "ignore-eos", c.IgnoreEOS, `send "ignore_eos": true (exact output lengths on vLLM/SGLang)`)
	fs.Var((*stringList)(&c.Headers), "header", "extra request header `Name: value` (repeatable)")
	fs.BoolVar(&c.Insecure, "insecure", c.Insecure, "skip TLS certificate verification")
	fs.StringVar(&c.CAFile, "ca", c.CAFile, "PEM `file` of trusted CA certificates")
	fs.StringVar(&c.PinSHA256, "pin-sha256", c.PinSHA256, "base64 SHA-256 of the server's public key (replaces chain verification)")
	fs.StringVar(&c.Workload, "workload", c.Workload, "chat, translate, batch or custom (default chat)")
	fs.Var(&c.PromptTokens, "prompt-tokens", "prompt length distribution: N, MIN-MAX or lognormal:MEDIAN:SIGMA[:MIN:MAX]")
	fs.Var(&c.OutputTokens, "output-tokens", "output length distribution (max_tokens), same syntax")
	fs.Int64Var(&c.Seed, "seed", c.Seed, "random seed for lengths, prompts and arrivals (default 1)")
	fs.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "closed-loop concurrency (default 1)")
	fs.Float64Var(&c.Rate, "rate", c.Rate, "open-loop Poisson arrival rate in requests/s (overrides -concurrency)")
	fs.DurationVar(&c.Duration, "duration", c.Duration, "measured duration (default 30s when -requests is not set)")
	fs.IntVar(&c.Requests, "requests", c.Requests, "measured request count")
	fs.DurationVar(&c.Warmup, "warmup", c.Warmup, "warm-up duration before measuring")
	fs.DurationVar(&c.Ramp, "ramp", c.Ramp, "closed loop: start the workers evenly over this `duration` (not measured; every phase)")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "per-request timeout (default 5m)")
	fs.DurationVar(&c.Drain, "drain", c.Drain, "time allowed for in-flight requests at the end (default 60s)")
	fs.IntVar(&c.MaxInFlight, "max-inflight", c.MaxInFlight, "open-loop in-flight cap; arrivals beyond it are dropped (default 10000)")
	fs.IntVar(&c.Rounds, "rounds", c.Rounds, "compare mode: rounds per target (default 4)")
	fs.Var((*intList)(&c.PIDs), "pid", "process ids whose CPU time per 1,000 tokens is reported (comma list, repeatable)")
	fs.Var(&c.Sweep, "sweep", "sweep `concurrency=1,2,4` or `rate=5,10,20`")
	fs.StringVar(&c.JSON, "json", c.JSON, "write the report as JSON to `file` (- for stdout)")
	fs.StringVar(&c.CSV, "csv", c.CSV, "write the report (or sweep points) as CSV to `file` (- for stdout)")
	fs.StringVar(&c.RequestsCSV, "requests-csv", c.RequestsCSV, "write one CSV row per request to `file`")
	fs.StringVar(&c.SVG, "svg", c.SVG, "write the sweep curve as SVG to `file`")
	fs.StringVar(&c.Progress, "progress", c.Progress, "live progress line: auto, always or never (default auto)")
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ", ") }

func (l *stringList) Set(s string) error {
	*l = append(*l, s)
	return nil
}

// intList is a repeatable flag of comma-separated integers.
type intList []int

func (l *intList) String() string {
	parts := make([]string, len(*l))
	for i, v := range *l {
		parts[i] = strconv.Itoa(v)
	}
	return strings.Join(parts, ",")
}

func (l *intList) Set(s string) error {
	for f := range strings.SplitSeq(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return fmt.Errorf("parsing %q: %w", f, err)
		}
		*l = append(*l, v)
	}
	return nil
}
