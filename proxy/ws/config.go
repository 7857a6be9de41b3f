package ws

import (
	"net/http"
	"time"

	"github.com/sluice-proxy/sluice/internal/units"
)

// Config tunes WebSocket handling: the bridge endpoint (a
// multiplexed streaming API over one socket, bridged to SSE backends) and
// passthrough routes (kind: websocket). Zero fields take the defaults named
// on each field (see WithDefaults).
type Config struct {
	// Enabled turns the bridge endpoint on. Nil means true. Passthrough
	// routes do not depend on it.
	Enabled *bool `yaml:"enabled"`
	// Path is the bridge endpoint's path (exact match, GET with an RFC 6455
	// upgrade). Default "/v1/ws".
	Path string `yaml:"path"`
	// MaxInflight bounds the requests running at once on one bridged
	// socket; more are refused with an error frame. Default 16.
	MaxInflight int `yaml:"max_inflight"`
	// RequestRate bounds the request frames one socket may start per
	// second (token bucket, RequestBurst deep): a socket cannot flood the
	// limiter and the backends faster than HTTP clients could. Default 20.
	RequestRate float64 `yaml:"request_rate"`
	// RequestBurst is the bucket depth for RequestRate. Default 40.
	RequestBurst int `yaml:"request_burst"`
	// SendQueue is the number of frames one socket may have queued for the
	// client. When it is full the request producing a frame waits, so the
	// relay stops reading from its backend. Default 64.
	SendQueue int `yaml:"send_queue"`
	// SlowClientDeadline is how long a request may wait for room in a full
	// send queue before it is cancelled with an error frame. Default 10s.
	SlowClientDeadline time.Duration `yaml:"slow_client_deadline"`
	// PingInterval is how often Sluice pings the client. A peer from which
	// nothing (not even a pong) is heard for two intervals, or that accepts
	// no bytes for two intervals, is closed. Default 25s.
	PingInterval time.Duration `yaml:"ping_interval"`
	// IdleTimeout closes a bridged socket that has had no request in
	// flight and no frame from the client for this long (close 1000).
	// Default 5m.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxMessageBytes bounds one message from the client (and, in
	// passthrough, from the backend); larger ones close the socket with
	// 1009. Default: the proxy's max_body_bytes plus 64KiB.
	MaxMessageBytes units.Bytes `yaml:"max_message_bytes"`
	// AllowedOrigins lists the browser origins ("https://app.example.com",
	// "https://*.example.com", or "*" for any) allowed to open sockets.
	// Empty means same-origin only. Requests without an Origin header
	// (non-browser clients) are always allowed.
	AllowedOrigins []string `yaml:"allowed_origins"`
	// MaxSocketsPerAddr caps the sockets (bridge and passthrough together)
	// open at once from one client IP address on a node; more upgrades
	// are refused with 429 before the upgrade. Default 256.
	MaxSocketsPerAddr int `yaml:"max_sockets_per_addr"`
	// MaxSocketsPerTenant caps the sockets open at once for one tenant on
	// a node; more upgrades are refused with 429 before the upgrade.
	// Default 1024.
	MaxSocketsPerTenant int `yaml:"max_sockets_per_tenant"`
}

// WithDefaults returns c with zero fields set to their defaults;
// maxBody is the proxy's max_body_bytes.
func (c Config) WithDefaults(maxBody units.Bytes) Config {
	if c.Enabled == nil {
		on := true
		c.Enabled = &on
	}
	if c.Path == "" {
		c.Path = "/v1/ws"
	}
	if c.MaxInflight == 0 {
		c.MaxInflight = 16
	}
	if c.RequestRate == 0 {
		c.RequestRate = 20
	}
	if c.RequestBurst == 0 {
		c.RequestBurst = 40
	}
	if c.SendQueue == 0 {
		c.SendQueue = 64
	}
	if c.SlowClientDeadline == 0 {
		c.SlowClientDeadline = 10 * time.Second
	}
	if c.PingInterval == 0 {
		c.PingInterval = 25 * time.Second
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 5 * time.Minute
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = maxBody + 64<<10
	}
	if c.MaxSocketsPerAddr == 0 {
		c.MaxSocketsPerAddr = DefaultMaxSocketsPerAddr
	}
	if c.MaxSocketsPerTenant == 0 {
		c.MaxSocketsPerTenant = DefaultMaxSocketsPerTenant
	}
	return c
}

// Liveness is how long a peer may stay silent (no frame, no pong) or
// refuse bytes before its socket is closed: two ping intervals.
func (c Config) Liveness() time.Duration { return 2 * c.PingInterval }

// IsBridge reports whether r is for the bridge endpoint. c must have its
// defaults (WithDefaults).
func (c *Config) IsBridge(r *http.Request) bool {
	return *c.Enabled && r.URL.Path == c.Path
}
