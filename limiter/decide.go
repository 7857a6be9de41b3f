package limiter

// check accumulates one admission's checks: every configured limit is
// evaluated, the decision is all-or-nothing, and the refusal reported is
// the limit with the longest wait (ties: the first checked).
type check struct {
	reason string
	wait   float64 // ns
}

func (c *check) refuse(reason string, wait float64) {
	if c.reason == "" || wait > c.wait {
		c.reason, c.wait = reason, wait
	}
}

func (c *check) refused() bool { return c.reason != "" }

// decision turns a check into a Decision: refused when the check refused
// and the limits are enforced; in shadow mode allowed with WouldRefuse.
func (c *check) decision(p plan) Decision {
	if !c.refused() {
		return Decision{Allowed: true}
	}
	if !p.enforce {
		return Decision{Allowed: true, WouldRefuse: true, Reason: c.reason}
	}
	return Decision{Reason: c.reason, RetryAfter: durationNS(c.wait)}
}

// concurrencyQuota reports a lease set holding n leases.
func concurrencyQuota(maxConc, n int64) Quota {
	if maxConc <= 0 {
		return Quota{}
	}
	return Quota{Limit: maxConc, Remaining: max(maxConc-n, 0)}
}
