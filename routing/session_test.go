package routing

import (
	"fmt"
	"testing"
	"time"
)

func sessionPool(t testing.TB, n int, policy ...string) *Pool {
	t.Helper()
	var urls []string
	for i := range n {
		urls = append(urls, fmt.Sprintf("http://10.0.0.%d:8000", i+1))
	}
	pc := quiet(urls...)
	pc.Affinity.SessionHeader = "x-session-id"
	if len(policy) > 0 {
		pc.Policy = policy[0]
	}
	p, err := NewPool(pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// Rendezvous hashing: adding a sixth backend to five moves about 1/6 of
// 1000 sessions, all of them to the new backend.
func TestSessionAffinityAddingBackendMovesFew(t *testing.T) {
	five, six := sessionPool(t, 5), sessionPool(t, 6)
	moved := 0
	for i := range 1000 {
		w := Want{Session: fmt.Sprintf("tenant\x00session-%d", i)}
		a, b := acquire(t, five, w), acquire(t, six, w)
		if a.label != b.label {
			moved++
			if b.label != six.backends[5].label {
				t.Fatalf("session %d moved from %s to %s, not to the new backend", i, a.label, b.label)
			}
		}
	}
	if moved < 1000/6-60 || moved > 1000/6+60 {
		t.Fatalf("%d of 1000 sessions moved; want about 167 (1/6)", moved)
	}
	t.Logf("%d of 1000 sessions moved", moved)
}

// A session stays on its backend while it is healthy and not overloaded;
// it moves when its backend is ejected or over max_imbalance, and comes
// back after.
func TestSessionAffinityPinsWhileHealthy(t *testing.T) {
	p := sessionPool(t, 4)
	w := Want{Session: "t\x00abc"}
	home := acquire(t, p, w)
	for range 20 {
		if b := acquire(t, p, w); b != home {
			t.Fatalf("session moved from %s to %s with nothing changed", home.label, b.label)
		}
	}
	home.ejectedUntil.Store(time.Now().Add(time.Hour).UnixNano())
	away := acquire(t, p, w)
	if away == home {
		t.Fatal("session stayed on an ejected backend")
	}
	if b := acquire(t, p, w); b != away {
		t.Fatal("while its backend is out, the session's second choice is not stable")
	}
	home.ejectedUntil.Store(0)
	if b := acquire(t, p, w); b != home {
		t.Fatal("session did not come back to its healthy backend")
	}
	// Overloaded: 2 requests more than the others (max_imbalance 1).
	home.begin()
	home.begin()
	if b := acquire(t, p, w); b == home {
		t.Fatal("session pinned to a backend 2 requests above the others")
	}
	home.end()
	home.end()
	if pinned, moved := p.aff.sessionPinned.Load(), p.aff.sessionMoved.Load(); pinned != 22 || moved != 3 {
		t.Errorf("pinned %d moved %d; want 22 and 3", pinned, moved)
	}
}

// Under predicted_ttft a session is pinned as under any other policy, and a
// session that cannot stay (its backend ejected) goes to the lowest
// prediction.
func TestSessionAffinityUnderPredictedTTFT(t *testing.T) {
	p := sessionPool(t, 4, PolicyPredictedTTFT)
	w := Want{Session: "t\x00abc", Prompt: []byte(`[{"role":"user","content":"hello"}]`)}
	home := acquire(t, p, w)
	for range 20 {
		if b := acquire(t, p, w); b != home {
			t.Fatalf("session moved from %s to %s with nothing changed", home.label, b.label)
		}
	}
	home.ejectedUntil.Store(time.Now().Add(time.Hour).UnixNano())
	if away := acquire(t, p, w); away == home {
		t.Fatal("session stayed on an ejected backend")
	}
	home.ejectedUntil.Store(0)
	if b := acquire(t, p, w); b != home {
		t.Fatal("session did not come back to its healthy backend")
	}
}
