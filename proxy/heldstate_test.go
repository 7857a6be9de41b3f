package proxy_test

import (
	"net/http"
	"reflect"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/proxy/listen"
)

// TestLoopStreamDropsResponseWriter: once a committed HTTP/1.1 stream is
// on a loop, nothing of Sluice's keeps the server's response writer — and
// through it the connection's state — reachable: the writer is collected
// while the stream is still held. The eighth session's x.hsink kept it
// (~5 KiB more per held stream, found only by BenchmarkHeldStreams and
// run.sh's target 4); with the own request parser (SLUICE_H1_PARSER=own)
// the request's URL lives in the writer, and the shed request kept it too.
// (An HTTP/2 stream's writer is the stream itself, which its loop writes
// through: there is nothing to drop.)
func TestLoopStreamDropsResponseWriter(t *testing.T) {
	b := newStepBackend(t, 3)
	var freed atomic.Int32
	e := loopEdge(t, b.url, edgeOpts{server: watchWriters(&freed)})
	heldWriterFreed(t, e, b, h1Client(), e.http, &freed)
}

// watchWriters wraps the edge's handler: each chat request's response
// writer gets a cleanup that counts it in freed.
func watchWriters(freed *atomic.Int32) func(*listen.Server) {
	return func(s *listen.Server) {
		inner := s.Handler
		s.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/chat/completions" {
				// A cleanup, not a finalizer: the writer points to itself,
				// and a finalizer never runs on a cycle.
				runtime.AddCleanup((*byte)(reflect.ValueOf(w).UnsafePointer()), func(*atomic.Int32) { freed.Add(1) }, freed)
			}
			inner.ServeHTTP(w, r)
		})
	}
}

// heldWriterFreed opens one stream, waits until a loop holds it after its
// first token, and then wants its response writer collected before the
// stream ends; then it lets the stream finish.
func heldWriterFreed(t *testing.T, e *testEdge, b *stepBackend, c *http.Client, base string, freed *atomic.Int32) {
	t.Helper()
	resp := post(t, c, base+"/v1/chat/completions", chatBody(""))
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	ev := newEventReader(resp.Body)
	if got, err := ev.next(); err != nil || got != tokenEvent(0) {
		t.Fatalf("first token: %q %v", got, err)
	}
	onLoop(t, e, 1)
	deadline := time.Now().Add(5 * time.Second)
	for freed.Load() == 0 && time.Now().Before(deadline) {
		runtime.GC() // a cleanup runs after the collection that finds its object unreachable
		time.Sleep(10 * time.Millisecond)
	}
	if freed.Load() == 0 {
		t.Fatal("the held stream's response writer is still reachable: a loop stream keeps the server's connection state")
	}
	if n := e.handler.LoopStreams(); n != 1 {
		t.Fatalf("%d streams on the loops after the collection, want the held one", n)
	}
	for i := 1; i < 3; i++ {
		b.next <- struct{}{}
		if got, err := ev.next(); err != nil || got != tokenEvent(i) {
			t.Fatalf("token %d: %q %v", i, got, err)
		}
	}
	if got, err := ev.next(); err != nil || got != "data: [DONE]\n\n" {
		t.Fatalf("end: %q %v", got, err)
	}
	onLoop(t, e, 0)
}
