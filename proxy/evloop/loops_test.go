package evloop

import (
	"runtime"
	"testing"
)

// TestDefaultLoops: a group started without Loops has one loop fewer
// than GOMAXPROCS, at least one; LoopsEnv overrides the default, and a
// bad value makes New fail.
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
	g, err = New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(g.loops) != 3 || !g.help {
		t.Errorf("%s=3: %d loops, help %v", LoopsEnv, len(g.loops), g.help)
	}
	g.Close()

	t.Setenv(LoopsEnv, "x")
	if g, err := New(Options{}); err == nil {
		g.Close()
		t.Fatalf("%s=x: New did not fail", LoopsEnv)
	}
}
