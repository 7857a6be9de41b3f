package routing

import (
	"context"
	"math"
	"testing"
	"time"
)

// A failure weighs failPenalty requests on the backend's score at once and
// decays by half every failHalfLife; a success adds nothing.
func TestFailureLoadDecays(t *testing.T) {
	p, _ := NewPool(quiet("http://a:1", "http://b:1"))
	a := p.Backends()[0]
	t0 := time.Now()
	a.report(true, t0)
	if v := a.FailureLoad(t0); v != 0 {
		t.Fatalf("penalty after a success: %v", v)
	}
	a.report(false, t0)
	a.report(false, t0)
	if v := a.FailureLoad(t0); v != 2*failPenalty {
		t.Fatalf("penalty after two failures: %v; want %v", v, 2*failPenalty)
	}
	if v := a.FailureLoad(t0.Add(failHalfLife)); math.Abs(v-failPenalty) > 1e-9 {
		t.Fatalf("penalty one half-life later: %v; want %v", v, failPenalty)
	}
	if v := a.FailureLoad(t0.Add(20 * failHalfLife)); v != 0 {
		t.Fatalf("penalty twenty half-lives later: %v; want 0", v)
	}
	if s, want := a.Score(t0), 2*failPenalty; s != want {
		t.Fatalf("score %v; want the penalty %v (no request in flight)", s, want)
	}
}

// Issue 20: with two backends serving long streams and one that aborts
// every stream mid-way (ejection out of the way), the failing one must
// not draw most picks because its streams end early. Both scored
// policies; 40 picks, each stream on a good backend still running.
func TestPickAvoidsMidStreamFailures(t *testing.T) {
	for _, policy := range []string{PolicyLeastQueued, PolicyLeastRequest} {
		t.Run(policy, func(t *testing.T) {
			pc := quiet("http://good1:1", "http://good2:1", "http://bad:1")
			pc.Policy, pc.EjectAfter = policy, 1000
			p, _ := NewPool(pc)
			bad := p.Backends()[2]
			picks := map[*Backend]int{}
			for range 40 {
				at, err := p.Acquire(context.Background(), Want{})
				if err != nil {
					t.Fatal(err)
				}
				b := at.Backend()
				picks[b]++
				if b == bad {
					at.Progress(time.Now()) // a few events, then the abort
					at.End(Failed)
				} // the good backends' streams go on
			}
			if picks[bad] > 6 {
				t.Fatalf("the backend that aborts every stream got %d of 40 picks; want at most 6", picks[bad])
			}
			t.Logf("%s: bad backend %d of 40 picks", policy, picks[bad])
		})
	}
}
