package evloop

import (
	"bufio"
	"errors"
	"net/http/httputil"
	"runtime"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/chunked"
)

// TestOwnProcs: loops that hold their own Ps raise GOMAXPROCS by their
// number while they run and lower it again on Close; streams on them relay
// each event at once, and a client that leaves still closes the backend.
func TestOwnProcs(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	g, err := New(Options{Loops: 2, OwnProcs: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := runtime.GOMAXPROCS(0); got != before+2 {
		g.Close()
		t.Fatalf("GOMAXPROCS %d with two loops of their own, want %d", got, before+2)
	}
	// Both loops get a stream (round robin); the second ends by the
	// client leaving.
	up, cl, r := streamOn(t, g, Stream{Idle: 5 * time.Second})
	up2, cl2, r2 := streamOn(t, g, Stream{Idle: 5 * time.Second})
	cr := httputil.NewChunkedReader(bufio.NewReader(cl))
	buf := make([]byte, 256)
	for i := range 20 {
		up.Write(chunked.AppendChunk(nil, []byte(ev(i))))
		cl.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := cr.Read(buf)
		if err != nil || string(buf[:n]) != ev(i) {
			t.Fatalf("event %d: %q, %v", i, buf[:n], err)
		}
		time.Sleep(time.Millisecond) // the loop waits (held) between events
	}
	// With streams, a loop idle in a held wait is still stopped by the runtime: a
	// collection (stop the world) completes.
	done := make(chan struct{})
	go func() { runtime.GC(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("runtime.GC did not complete with loops waiting on their own Ps")
	}
	up.Write(chunked.AppendChunk(nil, []byte("data: [DONE]\n\n")))
	if res := r.wait(t); res.err != nil {
		t.Fatal(res.err)
	}
	cl2.Close()
	up2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := up2.Read(buf); err == nil {
		t.Fatal("backend's socket still open after the client left")
	}
	if res := r2.wait(t); !errors.Is(res.err, ErrClientGone) {
		t.Fatalf("closed with %v", res.err)
	}
	g.Close()
	if got := runtime.GOMAXPROCS(0); got != before {
		t.Fatalf("GOMAXPROCS %d after Close, want %d", got, before)
	}
}
