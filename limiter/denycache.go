package limiter

import (
	"sync"
	"time"
)

// denyCache remembers store refusals of the requests and token limits:
// a tenant (scope) refused until T is refused again locally, without a
// Redis call, for any request costing at least as much. Concurrency
// refusals are not cached: a slot frees whenever any stream ends.
type denyCache struct {
	mu      sync.Mutex
	entries map[denyKey]denyEntry
}

type denyKey struct{ tenant, model string }

type denyEntry struct {
	until   time.Time
	minCost int64 // refuse only requests whose token charge is at least this
	d       Decision
}

func (c *denyCache) key(req Request, p plan) denyKey {
	if p.scoped {
		return denyKey{req.Tenant, req.Model}
	}
	return denyKey{tenant: req.Tenant}
}

// check returns a refusal when req is covered by a live entry.
func (c *denyCache) check(req Request, p plan, now time.Time) (Decision, bool) {
	k := c.key(req, p)
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[k]
	if !ok {
		return Decision{}, false
	}
	if !now.Before(e.until) {
		delete(c.entries, k)
		return Decision{}, false
	}
	if costFor(e.d.Reason, p) < e.minCost {
		return Decision{}, false
	}
	d := e.d
	d.RetryAfter = e.until.Sub(now)
	return d, true
}

// note caches a store refusal d of req decided at now.
func (c *denyCache) note(req Request, p plan, d Decision, now time.Time) {
	if d.Allowed || d.RetryAfter <= 0 || d.Reason == ReasonConcurrency || d.Reason == ReasonStore {
		return
	}
	e := denyEntry{until: now.Add(d.RetryAfter), d: d, minCost: costFor(d.Reason, p)}
	c.mu.Lock()
	if c.entries == nil {
		c.entries = make(map[denyKey]denyEntry)
	}
	c.entries[c.key(req, p)] = e
	c.mu.Unlock()
}

// costFor is what a request is charged in the bucket behind reason.
func costFor(reason string, p plan) int64 {
	switch reason {
	case ReasonTokens:
		return p.total()
	case ReasonInputTokens:
		return p.costIn
	case ReasonOutputTokens:
		return p.costOut
	}
	return 0 // requests: every request costs one
}
