package limiter

import (
	"context"
	"sync/atomic"
	"time"
)

// Limits are one tenant's limits. A zero field means "no limit of that kind".
// They are passed to every decision, so a changed limit applies to the next
// admission without any migration of stored state.
type Limits struct {
	// MaxConcurrency is the most streams the tenant may have in flight
	// across all edge nodes. Zero means unlimited.
	MaxConcurrency int `yaml:"max_concurrency"`
	// TokensPerMinute limits input + output tokens. Zero means unlimited.
	TokensPerMinute int64 `yaml:"tokens_per_minute"`
	// InputTokensPerMinute and OutputTokensPerMinute optionally limit each
	// direction on its own. Zero means unlimited.
	InputTokensPerMinute  int64 `yaml:"input_tokens_per_minute"`
	OutputTokensPerMinute int64 `yaml:"output_tokens_per_minute"`
	// RequestsPerMinute limits admissions. Zero means unlimited.
	RequestsPerMinute int64 `yaml:"requests_per_minute"`
	// Burst is the token bucket depth. Zero means one minute of
	// TokensPerMinute.
	Burst int64 `yaml:"burst"`
	// DefaultMaxTokens is the output estimate charged at admission when the
	// request names no max_tokens / max_completion_tokens. Zero means 256.
	DefaultMaxTokens int64 `yaml:"default_max_tokens"`
	// MaxTokens is the ceiling on a request's output cap (max_tokens,
	// max_completion_tokens, max_output_tokens). Zero means the node's
	// default (proxy max_tokens), and no ceiling when that is zero too.
	// The proxy applies it; the limiter reserves what it is given.
	MaxTokens int64 `yaml:"max_tokens"`
	// MaxTokensPolicy is what happens to a request over MaxTokens:
	// "refuse" (default: 400 max_tokens_too_large) or "clamp" (the
	// request's cap is lowered to the ceiling).
	MaxTokensPolicy string `yaml:"max_tokens_policy"`
	// ChargePrefill is when a request's input tokens are charged although
	// it produced nothing: "accepted" (default: every attempt whose whole
	// request reached a backend that did not answer with an error status,
	// so a cancelled or timed-out prefill and each retried attempt are
	// charged once) or "first_token" (only an attempt that produced a
	// first token is charged).
	ChargePrefill string `yaml:"charge_prefill"`
	// Models overrides limits per model name (a zero field in an override
	// inherits the tenant's value).
	Models map[string]Limits `yaml:"models"`
	// OnStoreFailure is the policy when the shared store (Redis) fails or is
	// slow: "local" (default: each node enforces its share), "open" (admit)
	// or "closed" (refuse with 503).
	OnStoreFailure string `yaml:"on_store_failure"`
	// Enforce, when set to false, computes and reports limits without
	// refusing anything (shadow mode): every request is admitted, charged
	// and leased exactly as an admitted request would be (so the buckets
	// and lease counts show the real load), and Decision.WouldRefuse tells
	// when the limits would have refused it. Nil means true.
	Enforce *bool `yaml:"enforce"`
}

// Request is one admission request.
type Request struct {
	// ID identifies the request; an admission retried with the same ID is
	// charged once.
	ID string
	// Tenant is the tenant id.
	Tenant string
	// Model is the requested model, used for per-model overrides.
	Model string
	// Limits are the tenant's limits as configured now.
	Limits Limits
	// InputTokens is the estimated prompt size in tokens.
	InputTokens int64
	// OutputTokens is max_tokens / max_completion_tokens from the request,
	// or zero when the request names none (Limits.DefaultMaxTokens applies).
	OutputTokens int64
	// N is the number of choices the request asks for (OpenAI's n): the
	// output reservation is N times OutputTokens. Zero means 1.
	N int64
}

// Quota describes one limit for response headers.
type Quota struct {
	Limit     int64         // the limit per window (or concurrency)
	Remaining int64         // what is left now (never negative)
	Reset     time.Duration // until the quota is fully available again
}

// Decision is the outcome of an admission.
type Decision struct {
	// Allowed reports whether the request may proceed. In shadow mode
	// (Limits.Enforce false) Allowed is true and WouldRefuse tells.
	Allowed bool
	// WouldRefuse is set in shadow mode when the limits refused.
	WouldRefuse bool
	// Reason names the limit that refused: "concurrency", "tokens",
	// "input_tokens", "output_tokens" or "requests"; "store" when the
	// store failed under the closed policy.
	Reason string
	// RetryAfter is how long to wait before retrying, when refused.
	RetryAfter time.Duration
	// Degraded is set when the shared store was not used for this
	// decision (local, open or closed policy).
	Degraded bool
	// Requests, Tokens and Concurrency describe the limits for headers.
	// A zero Limit means that limit is not configured.
	Requests, Tokens, Concurrency Quota
	// InputTokens and OutputTokens describe the optional per-direction
	// token limits (zero Limit when not configured).
	InputTokens, OutputTokens Quota
	// Ticket is non-nil when the request was admitted; it must be passed
	// to Settle of the same limiter when the request ends, however it ends
	// (extra calls are no-ops). An unsettled Redis ticket keeps its lease
	// renewed by the heartbeat for as long as the process runs.
	Ticket *Ticket
}

// Usage is what a request actually consumed.
type Usage struct {
	InputTokens, OutputTokens int64
}

// Ticket is an admitted request's lease and charged estimate. Its fields are
// owned by the limiter implementation; callers read them and pass the
// ticket to Settle of the limiter that issued it.
type Ticket struct {
	ID     string
	Tenant string
	Model  string
	// ChargedInput and ChargedOutput are the input and output tokens charged
	// at admission (the reservation, capped at this limiter's share of each
	// burst). Every
	// configured token bucket was charged their sum (tokens), ChargedInput
	// (input tokens) or ChargedOutput (output tokens).
	ChargedInput  int64
	ChargedOutput int64

	plan    plan        // the limits as they were at admission
	settled atomic.Bool // set by the first Settle
	impl    any         // implementation-specific state
}

// Limiter admits and settles requests. Implementations are safe for
// simultaneous use by multiple goroutines.
type Limiter interface {
	// Admit decides whether a request may start, charging its estimate
	// and taking a concurrency lease when it may. An error means the
	// decision could not be made (the caller maps it to 503).
	Admit(ctx context.Context, req Request) (Decision, error)
	// Settle applies the actual usage (actual - charged) and releases the
	// lease. It is idempotent.
	Settle(ctx context.Context, t *Ticket, u Usage) error
}

// Service is a Limiter with what the command wires around it: Snapshot for
// the /v1/usage endpoint, Run for background work (the Redis heartbeat;
// Local has none) and Close. Local, Redis and Shared implement it.
type Service interface {
	Limiter
	// Snapshot reports a tenant's limits, use and what remains.
	Snapshot(ctx context.Context, tenant string, l Limits) (Status, error)
	// Run does the background work until ctx is done.
	Run(ctx context.Context) error
	// Close releases resources; call it after Run has returned.
	Close() error
}

var (
	_ Service = (*Local)(nil)
	_ Service = (*Redis)(nil)
	_ Service = (*Shared)(nil)
)
