package proxy_test

import (
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/sluice-proxy/sluice/proxy"
)

// The tests in this file run committed HTTP/3 streams through the event
// loops (SLUICE_H3_LOOP, handoff_h3.go, proxy/listen/h3loop.go): the
// stream taken over from quic-go's response writer, the backends reached
// with proxy/h1up. Clients: quic-go's http3.Transport, with small receive
// windows where the test needs a slow reader.

// h3LoopEdge is an edge whose h3 streams take the event loops.
func h3LoopEdge(t *testing.T, backend string, o edgeOpts) *testEdge {
	t.Helper()
	prev := proxy.SetH3Loop(true)
	t.Cleanup(func() { proxy.SetH3Loop(prev) })
	return loopEdge(t, backend, o)
}

// h3WindowClient is an HTTP/3 client whose streams' receive window is
// window bytes and never grows.
func h3WindowClient(t *testing.T, window uint64) *http.Client {
	tr := &http3.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
		QUICConfig: &quic.Config{InitialStreamReceiveWindow: window, MaxStreamReceiveWindow: window}}
	t.Cleanup(func() { tr.Close() })
	return &http.Client{Transport: tr}
}

// TestH3LoopEachTokenAtOnce: each token reaches the h3 client before the
// backend sends the next, the stream ends with [DONE], the Server-Timing
// trailer arrives, and the access log has the request.
func TestH3LoopEachTokenAtOnce(t *testing.T) {
	b := newStepBackend(t, 8)
	e := h3LoopEdge(t, b.url, edgeOpts{})
	resp := post(t, h3Client(t), e.h3+"/v1/chat/completions", chatBody(""), "TE", "trailers")
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 3 || resp.Header.Get("Content-Type") != "text/event-stream" ||
		resp.Header.Get("X-Request-Id") == "" || resp.Header.Get("Date") == "" {
		t.Fatalf("status %d proto %d header %v", resp.StatusCode, resp.ProtoMajor, resp.Header)
	}
	if st := resp.Header.Get("Server-Timing"); !strings.Contains(st, "upstream") {
		t.Fatalf("header Server-Timing %q", st)
	}
	onLoop(t, e, 1)
	ev := newEventReader(resp.Body)
	for i := range 8 {
		got, err := ev.next()
		if err != nil || got != tokenEvent(i) {
			t.Fatalf("token %d: %q %v", i, got, err)
		}
		if i < 7 {
			b.next <- struct{}{} // the backend sends the next only now
		}
	}
	if got, err := ev.next(); err != nil || got != "data: [DONE]\n\n" {
		t.Fatalf("end: %q %v", got, err)
	}
	if rest, err := io.ReadAll(resp.Body); err != nil || len(rest) != 0 {
		t.Fatalf("after [DONE]: %q %v", rest, err)
	}
	if st := resp.Trailer.Get("Server-Timing"); !strings.Contains(st, "decode;dur=") {
		t.Fatalf("trailer Server-Timing %q (trailer %v)", st, resp.Trailer)
	}
	onLoop(t, e, 0)
	waitFor(t, 5*time.Second, "the access log line", func() bool {
		return len(e.log.lines(`"status":200`, resp.Header.Get("X-Request-Id"), `"proto":"h3"`)) == 1
	})
}

// TestH3LoopNoTrailerUnasked: without "TE: trailers" the stream ends
// without a trailer.
func TestH3LoopNoTrailerUnasked(t *testing.T) {
	b := newStepBackend(t, 2)
	e := h3LoopEdge(t, b.url, edgeOpts{})
	resp := post(t, h3Client(t), e.h3+"/v1/chat/completions", chatBody(""))
	defer resp.Body.Close()
	onLoop(t, e, 1)
	b.next <- struct{}{}
	if _, done := readEvents(t, resp.Body); !done {
		t.Fatal("no [DONE]")
	}
	if len(resp.Trailer) != 0 {
		t.Fatalf("trailer %v sent to a client that did not ask", resp.Trailer)
	}
}

// TestH3LoopManyStreamsOneConn: many concurrent streams on one QUIC
// connection, all relayed by the loops, each complete and in order.
func TestH3LoopManyStreamsOneConn(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	e := h3LoopEdge(t, simURL, edgeOpts{})
	manyStreamsOneConn(t, e, h3Client(t), e.h3)
}

// TestH3LoopClientCancelCancelsBackend: the client cancelling its request
// (quic-go's client sends STOP_SENDING and RESET_STREAM) cancels the
// backend's request at once and is logged as the client's close.
func TestH3LoopClientCancelCancelsBackend(t *testing.T) {
	b := newStepBackend(t, 100)
	e := h3LoopEdge(t, b.url, edgeOpts{})
	cancelCancelsBackend(t, e, b, h3Client(t), e.h3, "STOP_SENDING")
}

// TestH3LoopConnCloseCancelsAll: the client's QUIC connection closing
// ends every stream on the loops and cancels each backend request.
func TestH3LoopConnCloseCancelsAll(t *testing.T) {
	b := newStepBackend(t, 100)
	e := h3LoopEdge(t, b.url, edgeOpts{})
	tr := &http3.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	c := &http.Client{Transport: tr}
	for range 3 {
		resp := post(t, c, e.h3+"/v1/chat/completions", chatBody(""))
		defer resp.Body.Close()
	}
	onLoop(t, e, 3)
	tr.Close() // closes the connection
	b.waitCancelledN(t, 3, "5s after the connection closed")
	onLoop(t, e, 0)
}

// TestH3LoopBackendDiesMidStream: the backend's connection closing before
// [DONE] ends the h3 stream with the error event and a clean end.
func TestH3LoopBackendDiesMidStream(t *testing.T) {
	b := newStepBackend(t, 10)
	b.cut.Store(3)
	e := h3LoopEdge(t, b.url, edgeOpts{})
	backendDiesMidStream(t, e, b, h3Client(t), e.h3)
}

// TestH3LoopIdleBackend: a backend that sends nothing for
// stream_idle_timeout ends the stream with the error event.
func TestH3LoopIdleBackend(t *testing.T) {
	b := newStepBackend(t, 10)
	e := h3LoopEdge(t, b.url, edgeOpts{proxy: proxy.Config{StreamIdleTimeout: 300 * time.Millisecond}})
	resp := post(t, h3Client(t), e.h3+"/v1/chat/completions", chatBody(""))
	defer resp.Body.Close()
	onLoop(t, e, 1)
	events, err := readEventsErr(resp.Body)
	if err != io.EOF {
		t.Fatalf("body ended with %v, want a clean end", err)
	}
	if len(events) != 2 || events[1].name != "error" {
		t.Fatalf("events %+v", events)
	}
	b.waitCancelled(t, "the idle backend's request was not cancelled")
	onLoop(t, e, 0)
}

// TestH3LoopTinyWindow: a client whose stream window is 100 bytes (less
// than one event) gets the whole stream in order, the loop pausing the
// backend's reads while the stream is blocked and resuming when the
// window opens (a backend sending as fast as it is read); nothing is
// lost.
func TestH3LoopTinyWindow(t *testing.T) {
	b := newStepBackend(t, 30)
	e := h3LoopEdge(t, b.url, edgeOpts{})
	resp := post(t, h3WindowClient(t, 100), e.h3+"/v1/chat/completions", chatBody(""), "TE", "trailers")
	defer resp.Body.Close()
	onLoop(t, e, 1)
	go func() { // the backend sends as fast as the loop reads it
		for range 29 {
			select {
			case b.next <- struct{}{}:
			case <-time.After(10 * time.Second):
				return
			}
		}
	}()
	var body []byte
	buf := make([]byte, 37)
	for {
		n, err := resp.Body.Read(buf)
		body = append(body, buf[:n]...)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("read: %v (body so far %q)", err, body)
		}
		time.Sleep(200 * time.Microsecond) // a slow reader
	}
	var want strings.Builder
	for i := range 30 {
		want.WriteString(tokenEvent(i))
	}
	want.WriteString("data: [DONE]\n\n")
	if string(body) != want.String() {
		t.Fatalf("body %q; want %q", body, want.String())
	}
	if st := resp.Trailer.Get("Server-Timing"); !strings.Contains(st, "decode;dur=") {
		t.Fatalf("trailer Server-Timing %q", st)
	}
	onLoop(t, e, 0)
}

// TestH3LoopSlowReaderBounded: a client that stops reading holds the
// stream on the loop (its window closed: the backend's reads paused)
// until stream_idle_timeout, which resets the stream and cancels the
// backend's request; the client got no more than its window.
func TestH3LoopSlowReaderBounded(t *testing.T) {
	b := newStepBackend(t, 100)
	e := h3LoopEdge(t, b.url, edgeOpts{proxy: proxy.Config{StreamIdleTimeout: 500 * time.Millisecond}})
	resp := post(t, h3WindowClient(t, 1024), e.h3+"/v1/chat/completions", chatBody(""))
	defer resp.Body.Close()
	onLoop(t, e, 1)
	sent := 0
	for range 40 { // the backend keeps sending; the loop must stop reading it
		select {
		case b.next <- struct{}{}:
			sent++
		case <-b.cancelled:
			goto cancelled
		case <-time.After(5 * time.Second):
			t.Fatal("the backend neither read on nor cancelled")
		}
	}
	b.waitCancelled(t, "the backend's request was not cancelled")
cancelled:
	onLoop(t, e, 0)
	body, err := io.ReadAll(resp.Body)
	if err == nil {
		t.Fatal("the stream ended cleanly for a client that read nothing")
	}
	if len(body) > 1024 {
		t.Fatalf("%d bytes past a 1,024-byte window", len(body))
	}
	t.Logf("backend sent %d tokens before its request was cancelled; the client got %d bytes", sent, len(body))
}

// TestH3LoopDrain: Shutdown waits for an h3 stream on the loop; one still
// running at the drain's deadline ends with the shutting_down event.
func TestH3LoopDrain(t *testing.T) {
	drainsStream(t, func(t *testing.T, b *stepBackend) (*testEdge, *http.Client, string) {
		e := h3LoopEdge(t, b.url, edgeOpts{})
		return e, h3Client(t), e.h3
	})
}

// TestH3LoopReloadKeepsStream: a reload (Swap) does not cut an h3 stream
// on the loop, and the previous state is reported done only after it
// ended.
func TestH3LoopReloadKeepsStream(t *testing.T) {
	b := newStepBackend(t, 3)
	e := h3LoopEdge(t, b.url, edgeOpts{})
	reloadKeepsStream(t, b, e, h3Client(t), e.h3)
}

// TestH3LoopOff: with SLUICE_H3_LOOP=0 the h3 stream stays on its
// handler's goroutine (nothing on the loops) and still completes, with
// its trailer.
func TestH3LoopOff(t *testing.T) {
	b := newStepBackend(t, 3)
	e := h3LoopEdge(t, b.url, edgeOpts{})
	proxy.SetH3Loop(false)
	resp := post(t, h3Client(t), e.h3+"/v1/chat/completions", chatBody(""), "TE", "trailers")
	defer resp.Body.Close()
	if _, err := newEventReader(resp.Body).next(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if n := e.handler.LoopStreams(); n != 0 {
		t.Fatalf("%d streams on the loops with the hand-off off", n)
	}
	b.next <- struct{}{}
	b.next <- struct{}{}
	events, done := readEvents(t, resp.Body)
	if !done || len(events) != 2 {
		t.Fatalf("done=%v, %d events", done, len(events))
	}
	if st := resp.Trailer.Get("Server-Timing"); !strings.Contains(st, "decode;dur=") {
		t.Fatalf("trailer Server-Timing %q", st)
	}
}
