package limiter

import (
	"strconv"
	"testing"
)

// TestPolicyQuotedNames: the policy names SetHeaders writes as Structured
// Field strings are the text strconv.Quote makes of them (they are
// written from constants instead of quoted per request).
func TestPolicyQuotedNames(t *testing.T) {
	q := Quota{Limit: 1}
	ps, n := Decision{Requests: q, Tokens: q, InputTokens: q, OutputTokens: q, Concurrency: q}.policies()
	if n != 5 {
		t.Fatalf("policies: %d, want 5", n)
	}
	for _, p := range ps[:n] {
		if want := strconv.Quote(p.name); p.quoted != want {
			t.Errorf("policy %q: quoted %s, want %s", p.name, p.quoted, want)
		}
	}
}
