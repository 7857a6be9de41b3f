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
// run.sh's target 4); and the own request parser (on since small7) puts
// the request's URL inside the writer, which the shed request kept too.
// (An HTTP/2 stream's writer is the stream itself, which its loop writes
// through: there is nothing to drop.)
func TestLoopStreamDropsResponseWriter(t *testing.T) {
	b := newStepBackend(t, 2)
	var freed atomic.Int32
	e := loopEdge(t, b.url, edgeOpts{server: watchWriters(&freed)})
	loopStreamHeld(t, h1Client(), e, b.next, func() {
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
	})
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
