package proxy

import (
	"time"

	"github.com/sluice-proxy/sluice/internal/units"
	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/proxy/observe"
	"github.com/sluice-proxy/sluice/proxy/ws"
)

// Config tunes the request pipeline. Zero fields take the defaults named on
// each field (see WithDefaults).
type Config struct {
	// MaxBodyBytes bounds a request body; larger bodies get 413.
	// Default 1MiB.
	MaxBodyBytes units.Bytes `yaml:"max_body_bytes"`
	// BodyReadTimeout bounds the time a request body may take to arrive;
	// past it the request gets 408. Default 30s.
	BodyReadTimeout time.Duration `yaml:"body_read_timeout"`
	// BodyMinRate is the slowest a body may arrive, in bytes per second,
	// once the first 5s have passed; slower bodies get 408. Default 4KiB.
	BodyMinRate units.Bytes `yaml:"body_min_rate"`
	// BodyMemoryBytes is the node-wide memory for request bodies being
	// received or held; a body that would exceed it gets 503. Default
	// 256MiB.
	BodyMemoryBytes units.Bytes `yaml:"body_memory_bytes"`
	// TenantBodiesInFlight is how many request bodies one tenant may be
	// sending at once on this node; more get 429. Default 32.
	TenantBodiesInFlight int `yaml:"tenant_bodies_in_flight"`
	// DialTimeout bounds connecting to a backend. Default 5s.
	DialTimeout time.Duration `yaml:"dial_timeout"`
	// FirstTokenTimeout bounds the wait for a backend's first event (or
	// a non-streamed response's first 32KiB, or all of a shorter one; the
	// rest of a longer one is bounded by StreamIdleTimeout between
	// pieces). Past it the request is retried on
	// another backend, or answered 504. Default 60s.
	FirstTokenTimeout time.Duration `yaml:"first_token_timeout"`
	// StreamIdleTimeout bounds the gap between two events of a running
	// stream; past it the stream ends with an error event. Default 2m.
	StreamIdleTimeout time.Duration `yaml:"stream_idle_timeout"`
	// Retries is how many other backends are tried when one fails before
	// the first token. Nil means 1; routes may override it.
	Retries *int `yaml:"retries"`
	// MaxResponseBytes bounds a non-streamed backend response, which is
	// streamed through: one declaring more gets 502, one sending more is
	// cut. Default 64MiB.
	MaxResponseBytes units.Bytes `yaml:"max_response_bytes"`
	// ResponseMemoryBytes bounds the windows of the non-streamed responses
	// being read on the node: each holds one 32KiB window (its head, then
	// its copy buffer; see respbody.go), so it bounds responses × 32KiB. A
	// response that would exceed it fails with 503. Default 512MiB.
	ResponseMemoryBytes units.Bytes `yaml:"response_memory_bytes"`
	// WebSocket tunes the WebSocket bridge and passthrough routes.
	WebSocket ws.Config `yaml:"websocket"`
	// SLO are the node's objectives, reported at /debug/stats and checked
	// by "sluice diagnose". Zero fields are not checked.
	SLO observe.SLO `yaml:"slo"`
	// MaxTokens is the node's default ceiling on a request's output cap
	// (max_tokens and its kin), for tenants whose limits set none
	// (limits.max_tokens). Zero means no ceiling.
	MaxTokens int64 `yaml:"max_tokens"`
	// TenantMetricLabels is how many distinct tenants get their own label
	// value on request and token counters; the rest share "other". Zero
	// means no per-tenant labels (bounded cardinality).
	TenantMetricLabels int `yaml:"tenant_metric_labels"`
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 1 << 20
	}
	if c.BodyReadTimeout <= 0 {
		c.BodyReadTimeout = 30 * time.Second
	}
	if c.BodyMinRate <= 0 {
		c.BodyMinRate = 4 << 10
	}
	if c.BodyMemoryBytes <= 0 {
		c.BodyMemoryBytes = 256 << 20
	}
	if c.TenantBodiesInFlight <= 0 {
		c.TenantBodiesInFlight = 32
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.FirstTokenTimeout == 0 {
		c.FirstTokenTimeout = 60 * time.Second
	}
	if c.StreamIdleTimeout == 0 {
		c.StreamIdleTimeout = 2 * time.Minute
	}
	if c.Retries == nil {
		one := 1
		c.Retries = &one
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = 64 << 20
	}
	if c.ResponseMemoryBytes <= 0 {
		c.ResponseMemoryBytes = 512 << 20
	}
	c.WebSocket = c.WebSocket.WithDefaults(c.MaxBodyBytes)
	return c
}

// TenantConfig is one API tenant.
type TenantConfig struct {
	// ID names the tenant in limits, metrics and logs.
	ID string `yaml:"id"`
	// Keys are hashes of the tenant's API keys, as printed by
	// "sluice hash-key" ("sha256:<hex>"). Keys themselves never appear in
	// config.
	Keys []string `yaml:"keys"`
	// Limits are the tenant's limits. Zero fields mean unlimited.
	Limits limiter.Limits `yaml:"limits"`
}
