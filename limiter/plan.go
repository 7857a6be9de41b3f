package limiter

import (
	"errors"
	"fmt"
	"math"
)

// Defaults of Limits fields.
const (
	// DefaultOutputEstimate is the output tokens charged at admission when
	// neither the request nor Limits.DefaultMaxTokens names a size.
	DefaultOutputEstimate = 256
	// concurrencyRetry is the Retry-After of a concurrency refusal: a slot
	// frees whenever any stream ends, so there is no exact time.
	concurrencyRetry = 1e9 // ns
)

// Refusal reasons (Decision.Reason).
const (
	ReasonConcurrency  = "concurrency"
	ReasonRequests     = "requests"
	ReasonTokens       = "tokens"
	ReasonInputTokens  = "input_tokens"
	ReasonOutputTokens = "output_tokens"
	ReasonStore        = "store"
)

// Max-tokens policies (Limits.MaxTokensPolicy) and prefill charging
// (Limits.ChargePrefill).
const (
	MaxTokensRefuse   = "refuse"
	MaxTokensClamp    = "clamp"
	PrefillAccepted   = "accepted"
	PrefillFirstToken = "first_token"
)

// Store-failure policies (Limits.OnStoreFailure).
const (
	PolicyLocal  = "local"
	PolicyOpen   = "open"
	PolicyClosed = "closed"
)

// Effective returns the limits that apply to a request for model: the
// override in l.Models merged over l (a zero field in the override inherits
// l's value), and whether an override exists. Requests for a model with an
// override are counted in that model's own buckets and lease set; requests
// for other models share the tenant's.
func (l Limits) Effective(model string) (Limits, bool) {
	o, ok := l.Models[model]
	if !ok || model == "" {
		return l, false
	}
	e := l
	e.Models = nil
	if o.MaxConcurrency != 0 {
		e.MaxConcurrency = o.MaxConcurrency
	}
	setIf(&e.TokensPerMinute, o.TokensPerMinute)
	setIf(&e.InputTokensPerMinute, o.InputTokensPerMinute)
	setIf(&e.OutputTokensPerMinute, o.OutputTokensPerMinute)
	setIf(&e.RequestsPerMinute, o.RequestsPerMinute)
	setIf(&e.Burst, o.Burst)
	setIf(&e.DefaultMaxTokens, o.DefaultMaxTokens)
	setIf(&e.MaxTokens, o.MaxTokens)
	if o.MaxTokensPolicy != "" {
		e.MaxTokensPolicy = o.MaxTokensPolicy
	}
	if o.ChargePrefill != "" {
		e.ChargePrefill = o.ChargePrefill
	}
	if o.OnStoreFailure != "" {
		e.OnStoreFailure = o.OnStoreFailure
	}
	if o.Enforce != nil {
		e.Enforce = o.Enforce
	}
	return e, true
}

func setIf(dst *int64, v int64) {
	if v != 0 {
		*dst = v
	}
}

// Policy returns the store-failure policy, "local" when unset.
func (l Limits) Policy() string {
	if l.OnStoreFailure == "" {
		return PolicyLocal
	}
	return l.OnStoreFailure
}

// Enforced reports whether refusals are enforced (false in shadow mode).
func (l Limits) Enforced() bool { return l.Enforce == nil || *l.Enforce }

// bucket is one GCRA bucket's parameters. A zero rate means no limit.
type bucket struct {
	rate  float64 // units per minute
	burst float64 // bucket depth in units
}

func (b bucket) on() bool { return b.rate > 0 }

// capacity is the largest charge b can ever admit: its burst.
func (b bucket) capacity() int64 { return max(1, int64(b.burst)) }

// plan is what one admission checks and charges: the effective limits
// scaled by a share, and the estimate. It is kept by value in a Ticket, so
// Settle applies the limits that were in force at admission.
type plan struct {
	maxConc           int64
	req, tok, in, out bucket
	costIn, costOut   int64
	enforce, scoped   bool
	policy            string
}

// newPlan derives the plan for req with the limits scaled by share
// (1 for the shared store; 1/N for a node's local share).
func newPlan(req Request, share float64) plan {
	l, scoped := req.Limits.Effective(req.Model)
	p := plan{enforce: l.Enforced(), scoped: scoped, policy: l.Policy()}
	if l.MaxConcurrency > 0 {
		p.maxConc = max(1, int64(math.Ceil(float64(l.MaxConcurrency)*share)))
	}
	burst := l.Burst
	if burst <= 0 {
		burst = l.TokensPerMinute
	}
	p.req = scaled(l.RequestsPerMinute, l.RequestsPerMinute, share)
	p.tok = scaled(l.TokensPerMinute, burst, share)
	p.in = scaled(l.InputTokensPerMinute, l.InputTokensPerMinute, share)
	p.out = scaled(l.OutputTokensPerMinute, l.OutputTokensPerMinute, share)
	p.costIn, p.costOut = estimate(p, l, req)
	return p
}

func scaled(rate, burst int64, share float64) bucket {
	if rate <= 0 {
		return bucket{}
	}
	return bucket{rate: float64(rate) * share, burst: max(1, float64(burst)*share)}
}

// Reserve is what an admission of req reserves before any cap: the input
// estimate plus the output cap (max_tokens, else Limits.DefaultMaxTokens,
// else DefaultOutputEstimate) times the number of choices, saturating at
// maxUsage. l are the effective limits of req's model.
func Reserve(l Limits, req Request) (in, out int64) {
	in = min(max(0, req.InputTokens), maxUsage)
	out = req.OutputTokens
	if out <= 0 {
		out = l.DefaultMaxTokens
	}
	if out <= 0 {
		out = DefaultOutputEstimate
	}
	n := max(req.N, 1)
	if out > maxUsage/n {
		return in, maxUsage
	}
	return in, out * n
}

// TooLarge is a request whose reservation exceeds a bucket's burst: no
// admission can ever take it, so it is refused for good (not with 429).
type TooLarge struct {
	// Reason names the bucket: ReasonTokens, ReasonInputTokens or
	// ReasonOutputTokens.
	Reason string
	// Need is the reservation; Burst the bucket's depth.
	Need, Burst int64
}

// Oversize reports whether req's reservation can never fit the burst of
// one of its token buckets (the tenant's whole limit, not a node's share),
// and which; nil when it fits.
func Oversize(req Request) *TooLarge {
	p := newPlan(req, 1)
	l, _ := req.Limits.Effective(req.Model)
	in, out := Reserve(l, req)
	switch {
	case p.tok.on() && in+out > p.tok.capacity():
		return &TooLarge{Reason: ReasonTokens, Need: in + out, Burst: p.tok.capacity()}
	case p.in.on() && in > p.in.capacity():
		return &TooLarge{Reason: ReasonInputTokens, Need: in, Burst: p.in.capacity()}
	case p.out.on() && out > p.out.capacity():
		return &TooLarge{Reason: ReasonOutputTokens, Need: out, Burst: p.out.capacity()}
	}
	return nil
}

// estimate is the charge at admission: the reservation (Reserve), each
// direction capped at its bucket's burst and the sum at the total bucket's
// burst (output reduced first). A request that fits the tenant's limit
// (Oversize nil) is never capped under the shared store; the cap only
// applies to a node's local share in degraded mode, where it keeps such a
// request admissible (the settle charges what it really used).
func estimate(p plan, l Limits, req Request) (in, out int64) {
	in, out = Reserve(l, req)
	if p.in.on() {
		in = min(in, p.in.capacity())
	}
	if p.out.on() {
		out = min(out, p.out.capacity())
	}
	if p.tok.on() {
		c := p.tok.capacity()
		in = min(in, c)
		out = min(out, c-in)
	}
	return in, out
}

// maxUsage bounds the tokens one settle applies per direction, so that a
// bogus usage report cannot push a TAT beyond what int64 and float64 hold.
const maxUsage = 1 << 40

// clampUsage returns u with each count in [0, maxUsage].
func clampUsage(u Usage) (in, out int64) {
	return min(max(u.InputTokens, 0), maxUsage), min(max(u.OutputTokens, 0), maxUsage)
}

// total is the charge to the tokens bucket.
func (p plan) total() int64 { return p.costIn + p.costOut }

// Validate reports every problem in l, each naming the YAML field
// (models.<name>.<field> inside overrides).
func (l Limits) Validate() error {
	errs := l.validate("")
	for _, m := range modelNames(l) {
		o := l.Models[m]
		if len(o.Models) > 0 {
			errs = append(errs, fmt.Errorf("models.%s.models: overrides do not nest", m))
		}
		errs = append(errs, o.validate("models."+m+".")...)
	}
	if _, ok := l.Models[""]; ok {
		errs = append(errs, errors.New("models: a model name must not be empty"))
	}
	return errors.Join(errs...)
}

func (l Limits) validate(prefix string) []error {
	var errs []error
	for _, f := range []struct {
		name string
		v    int64
	}{{"max_concurrency", int64(l.MaxConcurrency)}, {"tokens_per_minute", l.TokensPerMinute},
		{"input_tokens_per_minute", l.InputTokensPerMinute}, {"output_tokens_per_minute", l.OutputTokensPerMinute},
		{"requests_per_minute", l.RequestsPerMinute}, {"burst", l.Burst}, {"default_max_tokens", l.DefaultMaxTokens}} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("%s%s: must not be negative, got %d", prefix, f.name, f.v))
		}
	}
	if err := ValidatePolicy(l.OnStoreFailure); err != nil {
		errs = append(errs, fmt.Errorf("%s%w", prefix, err))
	}
	if l.MaxTokens < 0 {
		errs = append(errs, fmt.Errorf("%smax_tokens: must not be negative, got %d", prefix, l.MaxTokens))
	}
	switch l.MaxTokensPolicy {
	case "", MaxTokensRefuse, MaxTokensClamp:
	default:
		errs = append(errs, fmt.Errorf("%smax_tokens_policy: must be %q or %q, got %q", prefix,
			MaxTokensRefuse, MaxTokensClamp, l.MaxTokensPolicy))
	}
	switch l.ChargePrefill {
	case "", PrefillAccepted, PrefillFirstToken:
	default:
		errs = append(errs, fmt.Errorf("%scharge_prefill: must be %q or %q, got %q", prefix,
			PrefillAccepted, PrefillFirstToken, l.ChargePrefill))
	}
	return errs
}
