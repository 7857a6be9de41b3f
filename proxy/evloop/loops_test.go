package evloop

import (
	"runtime"
	"testing"
)

// TestDefaultLoops: a group started without Loops has one loop fewer
// than GOMAXPROCS, at least one; LoopsEnv and WaitEnv override the
// defaults, and a bad value makes New fail.
func TestDefaultLoops(t *testing.T) {
	for procs, want := range map[int]int{1: 1, 2: 1, 3: 2, 8: 7, 64: 63} {
		if got := DefaultLoops(procs); got != want {
			t.Errorf("DefaultLoops(%d) = %d, want %d", procs, got, want)
		}
	}
	g, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(g.loops), DefaultLoops(runtime.GOMAXPROCS(0)); got != want {
		t.Errorf("%d loops, want %d", got, want)
	}
	g.Close()

	t.Setenv(LoopsEnv, "3")
	t.Setenv(WaitEnv, "blocking")
	g, err = New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(g.loops) != 3 || !g.loops[0].opts.Blocking || g.help {
		t.Errorf("%s=3 %s=blocking: %d loops, blocking %v, help %v", LoopsEnv, WaitEnv, len(g.loops), g.loops[0].opts.Blocking, g.help)
	}
	g.Close()

	t.Setenv(LoopsEnv, "")
	t.Setenv(WaitEnv, "polled")
	g, err = New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !g.loops[0].opts.Polled || !g.help {
		t.Errorf("%s=polled: polled %v, help %v", WaitEnv, g.loops[0].opts.Polled, g.help)
	}
	g.Close()

	for env, v := range map[string]string{LoopsEnv: "x", WaitEnv: "spin"} {
		t.Run(env, func(t *testing.T) {
			t.Setenv(env, v)
			if g, err := New(Options{}); err == nil {
				g.Close()
				t.Fatalf("%s=%q: New did not fail", env, v)
			}
		})
	}
}
