package proxy

import (
	"context"
	"net/http"
	"strings"
	"testing"
)

// flushRecorder is a ResponseWriter that keeps what reaches the client and
// counts flushes, without allocating per write once grown.
type flushRecorder struct {
	hdr     http.Header
	status  int
	out     []byte
	flushes int
}

func (w *flushRecorder) Header() http.Header { return w.hdr }
func (w *flushRecorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}
func (w *flushRecorder) Write(p []byte) (int, error) { w.out = append(w.out, p...); return len(p), nil }
func (w *flushRecorder) Flush()                      { w.flushes++ }

// The HTTP sink writes and flushes each event at once, sends a started
// stream's error as an event, declares trailers, and costs no allocation
// per event through the Sink interface.
func TestHTTPSink(t *testing.T) {
	w := &flushRecorder{hdr: http.Header{}, out: make([]byte, 0, 1<<16)}
	var s Sink = newHTTPSink(w)
	s.Start(http.StatusOK, true)
	ev := []byte("data: {\"n\":1}\n\n")
	if n, err := s.Event(ev, ev[6:13]); n != len(ev) || err != nil || w.flushes != 1 {
		t.Fatalf("Event = %d, %v after %d flushes; want %d, nil after 1", n, err, w.flushes, len(ev))
	}
	if n, err := s.Raw(nil); n != 0 || err != nil || w.flushes != 2 {
		t.Fatalf("Raw(nil) = %d, %v after %d flushes; want a flush", n, err, w.flushes)
	}
	s.Error(http.StatusBadGateway, []byte(`{"error":{}}`))
	if got, want := string(w.out), string(ev)+"event: error\ndata: {\"error\":{}}\n\n"; got != want || w.status != 200 {
		t.Fatalf("client got %d %q; want 200 %q", w.status, got, want)
	}
	s.End(http.Header{"Server-Timing": {"decode;dur=1"}})
	if got := w.hdr.Get(http.TrailerPrefix + "Server-Timing"); got != "decode;dur=1" {
		t.Fatalf("trailer %q; want decode;dur=1", got)
	}
	w.out = w.out[:0]
	if a := testing.AllocsPerRun(100, func() { s.Event(ev, ev[6:13]) }); a != 0 {
		t.Fatalf("%v allocations per event; want 0", a)
	}
}

// An error before the start is the whole answer: status, body, newline.
func TestHTTPSinkErrorAnswer(t *testing.T) {
	w := &flushRecorder{hdr: http.Header{}}
	s := newHTTPSink(w)
	sendError(s, &APIError{Status: 503, Type: "server_error", Code: "x", Message: "m", RetryAfter: 2})
	if w.status != 503 || w.hdr.Get("Retry-After") != "2" || !strings.HasSuffix(string(w.out), "}\n") ||
		!strings.Contains(string(w.out), `"code":"x"`) {
		t.Fatalf("got %d %v %q", w.status, w.hdr, w.out)
	}
	w = &flushRecorder{hdr: http.Header{}}
	sendError(newHTTPSink(w), ErrorOf(context.Canceled))
	if w.status != 0 || len(w.out) != 0 {
		t.Fatalf("499 wrote %d %q; want nothing (nobody listens)", w.status, w.out)
	}
}

// A stream's last event, held by Last when a trailer follows, is neither
// written nor flushed until End, which writes it unflushed beside the
// trailer: the server then sends both together when the handler returns.
func TestHTTPSinkLastEventLeavesWithTrailer(t *testing.T) {
	w := &flushRecorder{hdr: http.Header{}}
	s := newHTTPSink(w)
	s.Start(http.StatusOK, true)
	ev := []byte("data: {\"n\":1}\n\n")
	s.Event(ev, nil)
	done := []byte("data: [DONE]\n\n")
	if n, err := s.Last(done, doneMarker); n != len(done) || err != nil {
		t.Fatalf("Last = %d, %v; want %d, nil", n, err, len(done))
	}
	done[0] = 'X' // the caller's buffer is reused: the sink kept a copy
	if string(w.out) != string(ev) || w.flushes != 1 {
		t.Fatalf("before End the client has %q after %d flushes; want only the first event, flushed once", w.out, w.flushes)
	}
	s.End(http.Header{"Server-Timing": {"decode;dur=1"}})
	if got, want := string(w.out), string(ev)+"data: [DONE]\n\n"; got != want || w.flushes != 1 {
		t.Fatalf("after End the client has %q after %d flushes; want %q and no flush of its own", got, w.flushes, want)
	}
	if got := w.hdr.Get(http.TrailerPrefix + "Server-Timing"); got != "decode;dur=1" {
		t.Fatalf("trailer %q; want decode;dur=1", got)
	}
}
