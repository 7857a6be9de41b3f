package limiter

import (
	"context"
	"encoding/json"
	"sort"
	"time"
)

// Status is one tenant's limits, current use and what remains, as shown by
// the /v1/usage endpoint. A Quota whose Limit is zero is not configured and
// is left out of the JSON form.
type Status struct {
	Tenant string `json:"tenant"`
	// Model is set in the entries of Models.
	Model string `json:"model,omitempty"`
	// Enforced is false in shadow mode.
	Enforced bool `json:"enforced"`
	// Degraded is set when the shared store could not be read and the
	// figures are this node's local view.
	Degraded bool `json:"degraded,omitempty"`
	// InFlight is the number of streams holding a concurrency lease.
	InFlight     int64 `json:"in_flight"`
	Concurrency  Quota `json:"concurrency,omitzero"`
	Requests     Quota `json:"requests,omitzero"`
	Tokens       Quota `json:"tokens,omitzero"`
	InputTokens  Quota `json:"input_tokens,omitzero"`
	OutputTokens Quota `json:"output_tokens,omitzero"`
	// Models holds one entry per model with its own limits (Limits.Models).
	Models []Status `json:"models,omitempty"`
	// Region is the tenant's regional share and the fleet's global use
	// when the node runs in a region of several (region.go); nil otherwise.
	Region *RegionStatus `json:"region,omitempty"`
}

// MarshalJSON writes {"limit":…,"remaining":…,"reset":"6m0s","reset_ms":…}.
func (q Quota) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Limit     int64  `json:"limit"`
		Remaining int64  `json:"remaining"`
		Reset     string `json:"reset"`
		ResetMS   int64  `json:"reset_ms"`
	}{q.Limit, q.Remaining, resetString(q.Reset), ceilMS(q.Reset)})
}

// resetString formats a reset like OpenAI's x-ratelimit-reset-* headers:
// a Go duration rounded up to the millisecond ("6m0s", "1.5s", "20ms").
func resetString(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	return time.Duration(ceilMS(d) * int64(time.Millisecond)).String()
}

func ceilMS(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// modelNames returns the override names of l in a stable order.
func modelNames(l Limits) []string {
	names := make([]string, 0, len(l.Models))
	for m := range l.Models {
		if m != "" {
			names = append(names, m)
		}
	}
	sort.Strings(names)
	return names
}

// Snapshot reports tenant's limits and use on this node.
func (l *Local) Snapshot(_ context.Context, tenant string, lim Limits) (Status, error) {
	now := l.ns(time.Now())
	st := l.scopeStatus(tenant, "", lim, now)
	for _, m := range modelNames(lim) {
		st.Models = append(st.Models, l.scopeStatus(tenant, m, lim, now))
	}
	return st, nil
}

func (l *Local) scopeStatus(tenant, model string, lim Limits, now float64) Status {
	p := newPlan(Request{Tenant: tenant, Model: model, Limits: lim}, l.Share())
	t := l.tenant(tenant)
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.scope(model, p.scoped)
	var d Decision
	l.quotas(&d, p, s, now)
	return Status{Tenant: tenant, Model: model, Enforced: p.enforce, InFlight: s.inflight,
		Concurrency: d.Concurrency, Requests: d.Requests, Tokens: d.Tokens,
		InputTokens: d.InputTokens, OutputTokens: d.OutputTokens}
}
