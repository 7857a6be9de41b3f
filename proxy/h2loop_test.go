package proxy_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sluice-proxy/sluice/proxy"
)

// The tests in this file run committed HTTP/2 streams through the event
// loops (SLUICE_H2_LOOP, handoff_h2.go): Sluice's own HTTP/2 server over
// TLS, the backends reached with proxy/h1up. Clients: x/net's
// http2.Transport, and a client of frames (h2raw) where the test needs
// its own windows, resets or connection close.

// h2LoopEdge is an edge whose h2 streams take the event loops.
func h2LoopEdge(t *testing.T, backend string, o edgeOpts) *testEdge {
	t.Helper()
	if testH2Server == "go" {
		t.Skip("the event loops' h2 streams need Sluice's own HTTP/2 server")
	}
	prev := proxy.SetH2Loop(true)
	t.Cleanup(func() { proxy.SetH2Loop(prev) })
	return loopEdge(t, backend, o)
}

// xh2Client is x/net's HTTP/2 client over TLS (one connection).
func xh2Client() *http.Client {
	return &http.Client{Transport: &http2.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
}

// TestH2LoopEachTokenAtOnce: each token reaches the h2 client before the
// backend sends the next, the stream ends with [DONE], and the
// Server-Timing trailer arrives with END_STREAM.
func TestH2LoopEachTokenAtOnce(t *testing.T) {
	b := newStepBackend(t, 8)
	e := h2LoopEdge(t, b.url, edgeOpts{})
	resp := post(t, xh2Client(), e.https+"/v1/chat/completions", chatBody(""), "TE", "trailers")
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 2 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d proto %d header %v", resp.StatusCode, resp.ProtoMajor, resp.Header)
	}
	onLoop(t, e, 1)
	ev := newEventReader(resp.Body)
	for i := range 8 {
		got, err := ev.next()
		if err != nil || got != tokenEvent(i) {
			t.Fatalf("token %d: %q %v", i, got, err)
		}
		if i < 7 {
			b.next <- struct{}{}
		}
	}
	if got, err := ev.next(); err != nil || got != "data: [DONE]\n\n" {
		t.Fatalf("end: %q %v", got, err)
	}
	if rest, err := io.ReadAll(resp.Body); err != nil || len(rest) != 0 {
		t.Fatalf("after [DONE]: %q %v", rest, err)
	}
	if st := resp.Trailer.Get("Server-Timing"); !strings.Contains(st, "decode;dur=") {
		t.Fatalf("trailer Server-Timing %q", st)
	}
	onLoop(t, e, 0)
	waitFor(t, 5*time.Second, "the access log line", func() bool {
		return len(e.log.lines(`"status":200`, resp.Header.Get("X-Request-Id"), `"proto":"h2"`)) == 1
	})
}

// TestH2LoopManyStreamsOneConn: many concurrent streams on one client
// connection, all relayed by the loops, each complete and in order.
func TestH2LoopManyStreamsOneConn(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	e := h2LoopEdge(t, simURL, edgeOpts{})
	manyStreamsOneConn(t, e, xh2Client(), e.https)
}

// manyStreamsOneConn runs 24 streams of 40 tokens at once through one
// client (one connection) to base, checks each whole and that several
// were on the loops at once, and that none is left there.
func manyStreamsOneConn(t *testing.T, e *testEdge, c *http.Client, base string) {
	t.Helper()
	const n = 24
	var wg sync.WaitGroup
	errs := make(chan error, n)
	var maxOnLoop atomicMax
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
				maxOnLoop.note(e.handler.LoopStreams())
			}
		}
	}()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := post(t, c, base+"/v1/chat/completions", chatBody(`"max_tokens":40`))
			defer resp.Body.Close()
			events, err := readEventsErr(resp.Body)
			if err != io.EOF {
				errs <- err
				return
			}
			// the role chunk, 40 tokens, the finish chunk, [DONE]
			if len(events) != 43 || events[42].data != "[DONE]" {
				errs <- errors.New("stream incomplete: " + strconv.Itoa(len(events)) + " events")
			}
		}()
	}
	wg.Wait()
	close(stop)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if maxOnLoop.get() < 2 {
		t.Fatalf("at most %d streams on the loops at once", maxOnLoop.get())
	}
	onLoop(t, e, 0)
}

type atomicMax struct {
	mu sync.Mutex
	v  int64
}

func (m *atomicMax) note(v int64) {
	m.mu.Lock()
	m.v = max(m.v, v)
	m.mu.Unlock()
}

func (m *atomicMax) get() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.v
}

// TestH2LoopResetCancelsBackend: the client resetting its stream
// (x/net's Transport sends RST_STREAM when the request's context ends)
// cancels the backend's request at once.
func TestH2LoopResetCancelsBackend(t *testing.T) {
	b := newStepBackend(t, 100)
	e := h2LoopEdge(t, b.url, edgeOpts{})
	cancelCancelsBackend(t, e, b, xh2Client(), e.https, "RST_STREAM")
}

// cancelCancelsBackend: a client that cancels its request after the
// first event (its context ends) makes the edge cancel the backend's
// request at once and log the client's close; what names what the
// client sends.
func cancelCancelsBackend(t *testing.T, e *testEdge, b *stepBackend, c *http.Client, base, what string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := postCtx(t, ctx, c, base+"/v1/chat/completions", chatBody(""))
	defer resp.Body.Close()
	onLoop(t, e, 1)
	if _, err := newEventReader(resp.Body).next(); err != nil {
		t.Fatal(err)
	}
	cancel()
	b.waitCancelled(t, "the backend's request was not cancelled 5s after "+what)
	onLoop(t, e, 0)
	id := resp.Header.Get("X-Request-Id")
	waitFor(t, 5*time.Second, "the access log line", func() bool {
		return len(e.log.lines(id, `"error":"client_closed_request"`)) == 1
	})
}

// TestH2LoopBackendDiesMidStream: the backend's connection closing before
// [DONE] ends the h2 stream with the error event and END_STREAM.
func TestH2LoopBackendDiesMidStream(t *testing.T) {
	b := newStepBackend(t, 10)
	b.cut.Store(3)
	e := h2LoopEdge(t, b.url, edgeOpts{})
	backendDiesMidStream(t, e, b, xh2Client(), e.https)
}

// backendDiesMidStream: a backend (cut after 3 events) closing before
// [DONE] ends the client's stream with the error event and a clean end.
func backendDiesMidStream(t *testing.T, e *testEdge, b *stepBackend, c *http.Client, base string) {
	t.Helper()
	resp := post(t, c, base+"/v1/chat/completions", chatBody(""))
	defer resp.Body.Close()
	onLoop(t, e, 1)
	go func() {
		for range 3 {
			b.next <- struct{}{}
		}
	}()
	events, err := readEventsErr(resp.Body)
	if err != io.EOF {
		t.Fatalf("body ended with %v, want a clean end", err)
	}
	if len(events) != 4 || events[3].name != "error" || !strings.Contains(events[3].data, `"type":"server_error"`) {
		t.Fatalf("events %+v", events)
	}
	onLoop(t, e, 0)
}

// TestH2LoopDrain: Shutdown waits for an h2 stream on the loop; one still
// running at the drain's deadline ends with the shutting_down event and
// END_STREAM.
func TestH2LoopDrain(t *testing.T) {
	drainsStream(t, func(t *testing.T, b *stepBackend) (*testEdge, *http.Client, string) {
		e := h2LoopEdge(t, b.url, edgeOpts{})
		return e, xh2Client(), e.https
	})
}

// h2raw is a client of HTTP/2 frames over TLS, for windows, resets and
// closes of the test's own.
type h2raw struct {
	t    *testing.T
	conn *tls.Conn
	fr   *http2.Framer
	hbuf bytes.Buffer
	enc  *hpack.Encoder
	dec  *hpack.Decoder
	mu   sync.Mutex // writes
}

// dialH2Raw opens a connection announcing a stream window of window bytes
// (the connection's stays 65,535).
func dialH2Raw(t *testing.T, e *testEdge, window uint32) *h2raw {
	t.Helper()
	conn, err := tls.Dial("tcp", strings.TrimPrefix(e.https, "https://"), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := &h2raw{t: t, conn: conn, fr: http2.NewFramer(conn, conn)}
	c.enc = hpack.NewEncoder(&c.hbuf)
	c.dec = hpack.NewDecoder(4096, nil)
	io.WriteString(conn, http2.ClientPreface)
	c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: window})
	return c
}

// request opens stream id with a streamed chat request.
func (c *h2raw) request(id uint32, authority string) {
	body := chatBody(`"max_tokens":30`)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hbuf.Reset()
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "https"}, {":path", "/v1/chat/completions"},
		{":authority", authority}, {"authorization", "Bearer " + testKey}, {"content-type", "application/json"},
		{"content-length", strconv.Itoa(len(body))}} {
		c.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true})
	c.fr.WriteData(id, true, []byte(body))
}

// TestH2LoopTinyWindow: a client whose stream window is 16 bytes gets the
// whole stream in order, the loop pausing the backend's reads and
// resuming at each WINDOW_UPDATE; nothing is lost.
func TestH2LoopTinyWindow(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	e := h2LoopEdge(t, simURL, edgeOpts{})
	c := dialH2Raw(t, e, 16)
	c.request(1, strings.TrimPrefix(e.https, "https://"))
	c.conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	var body []byte
	sawLoop := false
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Fatalf("read: %v (body so far %q)", err, body)
		}
		sawLoop = sawLoop || e.handler.LoopStreams() == 1
		switch f := f.(type) {
		case *http2.DataFrame:
			if f.StreamID != 1 {
				continue
			}
			if len(f.Data()) > 16 {
				t.Fatalf("DATA of %d bytes past a 16-byte window", len(f.Data()))
			}
			body = append(body, f.Data()...)
			if f.StreamEnded() {
				goto end
			}
			if n := uint32(len(f.Data())); n > 0 {
				time.Sleep(time.Millisecond) // a slow reader
				c.mu.Lock()
				c.fr.WriteWindowUpdate(1, n)
				c.fr.WriteWindowUpdate(0, n)
				c.mu.Unlock()
			}
		case *http2.HeadersFrame:
			if f.StreamEnded() {
				goto end
			}
		case *http2.RSTStreamFrame:
			t.Fatalf("stream reset: %v", f.ErrCode)
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY %v", f.ErrCode)
		case *http2.SettingsFrame:
			if !f.IsAck() {
				c.mu.Lock()
				c.fr.WriteSettingsAck()
				c.mu.Unlock()
			}
		}
	}
end:
	events, err := readEventsErr(bytes.NewReader(body))
	// the role chunk, 30 tokens, the finish chunk, [DONE]
	if err != io.EOF || len(events) != 33 || events[32].data != "[DONE]" {
		t.Fatalf("%d events (%v): %q", len(events), err, body)
	}
	if !sawLoop {
		t.Fatal("the stream was never on the loops")
	}
	onLoop(t, e, 0)
}

// TestH2LoopSlowReaderBounded: a client that stops granting credit holds
// the stream on the loop (the backend's reads paused, bounded bytes held)
// until stream_idle_timeout, which resets the stream and cancels the
// backend's request.
func TestH2LoopSlowReaderBounded(t *testing.T) {
	b := newStepBackend(t, 100)
	e := h2LoopEdge(t, b.url, edgeOpts{proxy: proxy.Config{StreamIdleTimeout: 500 * time.Millisecond}})
	c := dialH2Raw(t, e, 256) // the head and the first token fit, the rest does not
	c.request(1, strings.TrimPrefix(e.https, "https://"))
	onLoop(t, e, 1)
	go func() { // the backend keeps sending; the loop must stop reading it
		for range 20 {
			select {
			case b.next <- struct{}{}:
			case <-time.After(3 * time.Second):
				return
			}
		}
	}()
	c.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := 0
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if d, ok := f.(*http2.DataFrame); ok {
			got += len(d.Data())
		}
		if r, ok := f.(*http2.RSTStreamFrame); ok && r.StreamID == 1 {
			break
		}
		if f.Header().StreamID == 1 && f.Header().Flags.Has(http2.FlagDataEndStream) {
			t.Fatal("the stream ended cleanly for a client that read nothing")
		}
	}
	if got > 256 {
		t.Fatalf("%d bytes of DATA past a 256-byte window", got)
	}
	b.waitCancelled(t, "the backend's request was not cancelled")
	onLoop(t, e, 0)
}

// TestH2LoopConnCloseCancelsAll: the client's connection closing ends
// every stream on the loops and cancels each backend request.
func TestH2LoopConnCloseCancelsAll(t *testing.T) {
	b := newStepBackend(t, 100)
	e := h2LoopEdge(t, b.url, edgeOpts{})
	c := dialH2Raw(t, e, 1<<20)
	for i := range 3 {
		c.request(uint32(1+2*i), strings.TrimPrefix(e.https, "https://"))
	}
	onLoop(t, e, 3)
	c.conn.Close()
	b.waitCancelledN(t, 3, "5s after the connection closed")
	onLoop(t, e, 0)
}

// TestH2LoopReloadKeepsStream: a reload (Swap) does not cut an h2 stream
// on the loop, and the previous state is reported done only after it
// ended.
func TestH2LoopReloadKeepsStream(t *testing.T) {
	b := newStepBackend(t, 3)
	e := h2LoopEdge(t, b.url, edgeOpts{})
	reloadKeepsStream(t, b, e, xh2Client(), e.https)
}

// TestH2LoopOff: with SLUICE_H2_LOOP=0 the h2 stream stays on its
// handler's goroutine (nothing on the loops) and still completes.
func TestH2LoopOff(t *testing.T) {
	b := newStepBackend(t, 3)
	e := h2LoopEdge(t, b.url, edgeOpts{})
	proxy.SetH2Loop(false)
	resp := post(t, xh2Client(), e.https+"/v1/chat/completions", chatBody(""))
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
}

// TestH2LoopCleartext: an h2c stream (prior knowledge, on the cleartext
// listener) takes the loops too, each token at once, [DONE] at the end.
func TestH2LoopCleartext(t *testing.T) {
	b := newStepBackend(t, 4)
	e := h2LoopEdge(t, b.url, edgeOpts{})
	resp := post(t, h2cClient(), e.http+"/v1/chat/completions", chatBody(""))
	defer resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("proto %d", resp.ProtoMajor)
	}
	onLoop(t, e, 1)
	ev := newEventReader(resp.Body)
	for i := range 4 {
		got, err := ev.next()
		if err != nil || got != tokenEvent(i) {
			t.Fatalf("token %d: %q %v", i, got, err)
		}
		if i < 3 {
			b.next <- struct{}{}
		}
	}
	if got, err := ev.next(); err != nil || got != "data: [DONE]\n\n" {
		t.Fatalf("end: %q %v", got, err)
	}
	onLoop(t, e, 0)
}
