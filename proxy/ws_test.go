package proxy_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-proxy/sluice/proxy/ws"
)

// Three requests on one socket stream interleaved, frame by frame, and each
// ends with a done frame carrying usage and timing.
func TestWSBridgeConcurrentRequests(t *testing.T) {
	cfg := fastSim()
	cfg.StepBase = 15 * time.Millisecond
	_, simURL := startSim(t, cfg)
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	c := dialWS(t, wsURL(e), keyHeader())

	ids := []string{"r1", "r2", "r3"}
	for _, id := range ids {
		request(t, c, id, chatBody(""))
	}
	frames := readUntilTerminal(t, c, len(ids))

	chunks := map[string]int{}
	done := map[string]wsFrame{}
	var order []string
	for _, f := range frames {
		switch f.Type {
		case "chunk":
			if _, ended := done[f.ID]; ended {
				t.Fatalf("chunk for %s after its done frame", f.ID)
			}
			if !json.Valid(f.Data) || f.Data[0] != '{' {
				t.Fatalf("chunk data %s is not a JSON object", f.Data)
			}
			if bytes.Contains(f.Data, []byte(`"choices":[]`)) {
				t.Fatalf("the usage chunk reached a client that did not ask for it: %s", f.Data)
			}
			chunks[f.ID]++
			order = append(order, f.ID)
		case "done":
			done[f.ID] = f
		default:
			t.Fatalf("unexpected frame %+v", f)
		}
	}
	switches := 0
	for i := 1; i < len(order); i++ {
		if order[i] != order[i-1] {
			switches++
		}
	}
	// Sequential streams would switch twice; interleaved ones switch at
	// nearly every token.
	if switches < 10 {
		t.Fatalf("chunk ids switched %d times over %d chunks (%v); want the streams interleaved", switches, len(order), order)
	}
	for _, id := range ids {
		d, ok := done[id]
		if !ok {
			t.Fatalf("no done frame for %s", id)
		}
		if d.Usage == nil || d.Usage.CompletionTokens != 12 || d.Usage.PromptTokens <= 0 ||
			d.Usage.TotalTokens != d.Usage.PromptTokens+d.Usage.CompletionTokens {
			t.Fatalf("%s: usage %+v; want 12 completion tokens and a prompt count", id, d.Usage)
		}
		tm := d.Timing
		if tm["ttft"] <= 0 || tm["e2e"] < tm["ttft"] || tm["tokens"] != 12 || tm["decode"] <= 0 {
			t.Fatalf("%s: timing %v; want ttft > 0, e2e ≥ ttft, decode, 12 tokens", id, tm)
		}
		for _, stage := range []string{"auth", "route", "upstream", "prefill", "edge", "itl-p50", "itl-p99", "tps"} {
			if _, ok := tm[stage]; !ok {
				t.Fatalf("%s: timing %v lacks %q", id, tm, stage)
			}
		}
		if _, ok := tm["tls"]; ok {
			t.Fatalf("%s: a request on an open socket reports a TLS handshake: %v", id, tm)
		}
		if tm["itl-p99"] < tm["itl-p50"] {
			t.Fatalf("%s: itl p99 %v < p50 %v", id, tm["itl-p99"], tm["itl-p50"])
		}
		if d.RequestID == "" {
			t.Fatalf("%s: done frame without request_id", id)
		}
		if chunks[id] < 12 {
			t.Fatalf("%s: %d chunks; want ≥ 12", id, chunks[id])
		}
	}
}

// A client that asks for the usage chunk gets it, as over HTTP; a
// non-streamed request arrives as one chunk and a done frame.
func TestWSBridgeUsageChunkAndNonStream(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	c := dialWS(t, wsURL(e), keyHeader())

	request(t, c, "u", chatBody(`"stream_options":{"include_usage":true}`))
	frames := readUntilTerminal(t, c, 1)
	last := frames[len(frames)-2]
	if last.Type != "chunk" || !bytes.Contains(last.Data, []byte(`"completion_tokens":12`)) {
		t.Fatalf("last chunk %s; want the usage chunk the client asked for", last.Data)
	}
	if d := frames[len(frames)-1]; d.Type != "done" || d.Usage == nil || d.Usage.CompletionTokens != 12 {
		t.Fatalf("terminal %+v; want done with usage", d)
	}

	request(t, c, "n", `{"model":"sim-small","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`)
	frames = readUntilTerminal(t, c, 1)
	if len(frames) != 2 || frames[0].Type != "chunk" || !bytes.Contains(frames[0].Data, []byte(`"object":"chat.completion"`)) {
		t.Fatalf("non-streamed: %+v; want one chunk with the completion, then done", frames)
	}
	if d := frames[1]; d.Type != "done" || d.Usage == nil || d.Usage.CompletionTokens != 5 {
		t.Fatalf("non-streamed terminal %+v; want done with usage", d)
	}
}

// A cancel frame, and closing the socket, cancel the upstream requests.
func TestWSBridgeCancel(t *testing.T) {
	cfg := fastSim()
	cfg.StepBase = 20 * time.Millisecond
	sim, simURL := startSim(t, cfg)
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	long := `{"model":"sim-small","stream":true,"max_tokens":5000,"messages":[{"role":"user","content":"x"}]}`

	t.Run("cancel frame", func(t *testing.T) {
		c := dialWS(t, wsURL(e), keyHeader())
		request(t, c, "a", long)
		request(t, c, "b", long)
		waitFor(t, 3*time.Second, "two running", func() bool { return sim.Stats().Running == 2 })
		sendJSON(t, c, map[string]string{"type": "cancel", "id": "a"})
		waitFor(t, 3*time.Second, "one cancelled upstream", func() bool { return sim.Stats().Running == 1 })
		var term wsFrame
		for term.Type == "" {
			if f := readFrame(t, c, 5*time.Second); f.terminal() {
				term = f
			}
		}
		if term.ID != "a" || term.Type != "error" || term.Status != 499 || term.Error == nil || term.Error.Code != "cancelled" {
			t.Fatalf("terminal frame %+v; want error 499 cancelled for a", term)
		}
		sendJSON(t, c, map[string]string{"type": "cancel", "id": "b"})
		waitFor(t, 3*time.Second, "both cancelled upstream", func() bool { return sim.Stats().Running == 0 })
	})
	t.Run("socket close", func(t *testing.T) {
		c := dialWS(t, wsURL(e), keyHeader())
		request(t, c, "a", long)
		request(t, c, "b", long)
		waitFor(t, 3*time.Second, "two running", func() bool { return sim.Stats().Running == 2 })
		readFrame(t, c, 5*time.Second)
		c.Close() // no close frame: the connection just goes away
		waitFor(t, 3*time.Second, "upstream cancelled", func() bool { return sim.Stats().Running == 0 })
	})
}

// bigFlood streams up to n large events as fast as the connection takes
// them, counting how many it managed to write.
type bigFlood struct {
	written atomic.Int64
	ended   chan struct{}
}

func (b *bigFlood) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.Atoi(r.URL.Query().Get("n"))
	if n > 100 {
		defer close(b.ended)
	}
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	ev := []byte(`data: {"choices":[{"delta":{"content":"` + strings.Repeat("x", 8<<10) + `"}}]}` + "\n\n")
	for i := 0; i < n; i++ {
		if _, err := w.Write(ev); err != nil {
			return
		}
		rc.Flush()
		b.written.Add(1)
	}
	w.Write([]byte("data: [DONE]\n\n"))
}

// A client that stops reading does not make Sluice buffer: the send queue
// fills, the relay stops reading the backend (which stops writing), and
// after the deadline the request ends with an error frame. The socket
// stays usable.
func TestWSBridgeSlowReader(t *testing.T) {
	be := &bigFlood{ended: make(chan struct{})}
	srv := httptest.NewServer(be)
	t.Cleanup(srv.Close)
	e := startEdge(t, edgeOpts{pool: poolOf(srv.URL)})
	const queue = 4
	setWS(e, func(c *ws.Config) {
		c.SendQueue = queue
		c.SlowClientDeadline = 300 * time.Millisecond
		c.PingInterval = 10 * time.Second
	}, nil)
	c := dialWS(t, wsURL(e), keyHeader())

	const total = 20000 // 160 MiB if nothing pushed back
	sendJSON(t, c, map[string]any{"type": "request", "id": "big", "path": "/v1/chat/completions?n=" + strconv.Itoa(total),
		"body": json.RawMessage(chatBody(""))})
	if f := readFrame(t, c, 5*time.Second); f.Type != "chunk" {
		t.Fatalf("first frame %+v; want a chunk", f)
	}
	// Stop reading. The backend must be cut off once the deadline passes.
	select {
	case <-be.ended:
	case <-time.After(20 * time.Second):
		t.Fatalf("backend still writing after 20s (%d events); the slow client was not cut off", be.written.Load())
	}
	if w := be.written.Load(); w >= total/2 {
		t.Fatalf("backend wrote %d of %d events while the client read none; want backpressure to stop it", w, total)
	}
	const frameBytes = 8<<10 + 128
	if peak := e.bridge.PeakQueued(); peak > (queue+2)*frameBytes {
		t.Fatalf("Sluice queued up to %d bytes for the socket; want at most %d (queue %d frames + 2)", peak, (queue+2)*frameBytes, queue)
	}
	chunks := 1
	var term wsFrame
	t.Logf("%v backend ended after %d events; reading", time.Now().Format("15:04:05.000"), be.written.Load())
	for term.Type == "" {
		if chunks%500 == 0 {
			t.Logf("read %d chunks", chunks)
		}
		f := readFrame(t, c, 10*time.Second)
		switch {
		case f.terminal():
			term = f
		case f.Type == "chunk":
			chunks++
		}
	}
	if term.Type != "error" || term.ID != "big" || term.Error == nil || term.Error.Code != "slow_client" {
		t.Fatalf("terminal %+v; want error slow_client for big", term)
	}
	t.Logf("backend wrote %d events, client got %d chunks, peak queued %d bytes", be.written.Load(), chunks, e.bridge.PeakQueued())

	sendJSON(t, c, map[string]any{"type": "request", "id": "small", "path": "/v1/chat/completions?n=3", "body": json.RawMessage(chatBody(""))})
	frames := readUntilTerminal(t, c, 1)
	if last := frames[len(frames)-1]; last.Type != "done" || len(frames) != 4 {
		t.Fatalf("after the slow request: %d frames ending %+v; want 3 chunks and done", len(frames), last)
	}
}

// Malformed frames get error frames and the socket stays usable.
func TestWSBridgeBadFrames(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	c := dialWS(t, wsURL(e), keyHeader())
	cases := []struct {
		name, msg, id, code string
		status              int
	}{
		{"not json", `{"type":"request",`, "", "invalid_frame", 400},
		{"no id", `{"type":"request","path":"/v1/chat/completions","body":{}}`, "", "invalid_frame", 400},
		{"unknown type", `{"type":"hello","id":"x"}`, "x", "invalid_frame", 400},
		{"no body", `{"type":"request","id":"y","path":"/v1/chat/completions"}`, "y", "invalid_frame", 400},
		{"bad path", `{"type":"request","id":"z","path":"http://evil/","body":{}}`, "z", "invalid_frame", 400},
		{"bridge path", `{"type":"request","id":"w","path":"/v1/ws","body":{}}`, "w", "invalid_frame", 400},
		{"bad body json", `{"type":"request","id":"v","path":"/v1/chat/completions","body":{"model":5}}`, "v", "invalid_type", 400},
		{"unknown model", `{"type":"request","id":"m","path":"/v1/chat/completions","body":{"model":"nope","messages":[]}}`, "m", "", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			if err := c.WriteMessage(websocket.TextMessage, []byte(tc.msg)); err != nil {
				t.Fatal(err)
			}
			f := readFrame(t, c, 5*time.Second)
			if f.Type != "error" || f.ID != tc.id || f.Error == nil {
				t.Fatalf("got %+v; want an error frame for id %q", f, tc.id)
			}
			if tc.status != 0 && (f.Status != tc.status || f.Error.Code != tc.code) {
				t.Fatalf("got %d %s; want %d %s", f.Status, f.Error.Code, tc.status, tc.code)
			}
		})
	}
	c.WriteMessage(websocket.BinaryMessage, []byte{1, 2, 3})
	if f := readFrame(t, c, 5*time.Second); f.Type != "error" || f.Error.Code != "invalid_frame" {
		t.Fatalf("binary frame: got %+v; want an error frame", f)
	}
	request(t, c, "ok", chatBody(""))
	frames := readUntilTerminal(t, c, 1)
	if last := frames[len(frames)-1]; last.Type != "done" || last.ID != "ok" {
		t.Fatalf("after bad frames: %+v; want done for ok", last)
	}
}

// A message over max_message_bytes closes the socket with 1009.
func TestWSBridgeOversizedMessage(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	setWS(e, func(c *ws.Config) { c.MaxMessageBytes = 4 << 10 }, nil)
	c := dialWS(t, wsURL(e), keyHeader())
	big := chatBody(`"user":"` + strings.Repeat("a", 8<<10) + `"`)
	request(t, c, "big", big)
	if code, _ := closeCode(t, c, 5*time.Second); code != websocket.CloseMessageTooBig {
		t.Fatalf("close code %d; want 1009", code)
	}
}

func TestWSBridgeAuth(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	url := wsURL(e)

	roundTrip := func(t *testing.T, c *websocket.Conn) {
		t.Helper()
		request(t, c, "r", chatBody(""))
		frames := readUntilTerminal(t, c, 1)
		if last := frames[len(frames)-1]; last.Type != "done" {
			t.Fatalf("terminal %+v; want done", last)
		}
	}
	t.Run("bearer header", func(t *testing.T) { roundTrip(t, dialWS(t, url, keyHeader())) })
	t.Run("tls", func(t *testing.T) {
		d := websocket.Dialer{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
		c, _, err := d.Dial("wss"+strings.TrimPrefix(e.https, "https")+"/v1/ws", keyHeader())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		roundTrip(t, c)
	})
	t.Run("x-api-key header", func(t *testing.T) {
		roundTrip(t, dialWS(t, url, http.Header{"X-Api-Key": {testKey}}))
	})
	t.Run("subprotocol", func(t *testing.T) {
		d := websocket.Dialer{Subprotocols: []string{"sluice.v1", "sluice.key." + testKey}}
		c, resp, err := d.Dial(url, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if got := resp.Header.Values("Sec-Websocket-Protocol"); len(got) != 1 || got[0] != "sluice.v1" {
			t.Fatalf("Sec-WebSocket-Protocol %q; want only sluice.v1 echoed", got)
		}
		for k, vv := range resp.Header {
			for _, v := range vv {
				if strings.Contains(v, testKey) {
					t.Fatalf("response header %s carries the key", k)
				}
			}
		}
		roundTrip(t, c)
	})
	for _, tc := range []struct {
		name      string
		hdr       http.Header
		protocols []string
	}{
		{"no key", nil, nil},
		{"bad bearer", http.Header{"Authorization": {"Bearer sk-wrong"}}, nil},
		{"bad subprotocol key", nil, []string{"sluice.v1", "sluice.key.sk-wrong"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if status, code := dialRefused(t, url, tc.hdr, tc.protocols...); status != 401 || code != "invalid_api_key" {
				t.Fatalf("got %d %q; want 401 invalid_api_key before the upgrade", status, code)
			}
		})
	}
	t.Run("plain GET", func(t *testing.T) {
		resp := postCtx(t, context.Background(), h1Client(), e.http+"/v1/ws", "")
		resp.Body.Close()
		if resp.StatusCode != http.StatusUpgradeRequired {
			t.Fatalf("status %d; want 426", resp.StatusCode)
		}
	})
}

func TestWSBridgeOrigin(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	url := wsURL(e)
	host := strings.TrimPrefix(e.http, "http://")
	withOrigin := func(o string) http.Header {
		h := keyHeader()
		h.Set("Origin", o)
		return h
	}
	if status, code := dialRefused(t, url, withOrigin("https://evil.example")); status != 403 || code != "origin_not_allowed" {
		t.Fatalf("foreign origin: %d %q; want 403 origin_not_allowed", status, code)
	}
	dialWS(t, url, withOrigin("http://"+host)).Close() // same origin

	setWS(e, func(c *ws.Config) {
		c.AllowedOrigins = []string{"https://app.example.com", "https://*.example.org"}
	}, nil)
	dialWS(t, url, withOrigin("https://app.example.com")).Close()
	dialWS(t, url, withOrigin("https://chat.example.org")).Close()
	if status, _ := dialRefused(t, url, withOrigin("https://example.org")); status != 403 {
		t.Fatalf("bare domain for a wildcard entry: %d; want 403", status)
	}
	if status, _ := dialRefused(t, url, withOrigin("http://app.example.com")); status != 403 {
		t.Fatalf("wrong scheme: %d; want 403", status)
	}
}

// Each request on the socket is admitted on its own: a refusal is an error
// frame with the limiter's retry delay; slots are released at each end.
func TestWSBridgeLimits(t *testing.T) {
	cfg := fastSim()
	cfg.StepBase = 20 * time.Millisecond
	_, simURL := startSim(t, cfg)
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	lim := newConcLimiter(2)
	setWS(e, func(c *ws.Config) { c.MaxInflight = 2 }, lim)
	c := dialWS(t, wsURL(e), keyHeader())
	long := `{"model":"sim-small","stream":true,"max_tokens":5000,"messages":[{"role":"user","content":"x"}]}`

	request(t, c, "a", long)
	request(t, c, "b", long)
	waitFor(t, 3*time.Second, "a and b admitted", func() bool { return lim.streams("t1") == 2 })
	request(t, c, "c", chatBody("")) // over max_inflight 2
	other := dialWS(t, wsURL(e), keyHeader())
	request(t, other, "d", chatBody("")) // over the tenant's 2 streams

	terminal := func(c *websocket.Conn, id string) wsFrame {
		for {
			if f := readFrame(t, c, 5*time.Second); f.ID == id && f.terminal() {
				return f
			}
		}
	}
	if f := terminal(c, "c"); f.Type != "error" || f.Status != 429 || f.Error.Code != "too_many_inflight" {
		t.Fatalf("c: %+v; want error 429 too_many_inflight", f)
	}
	if f := terminal(other, "d"); f.Type != "error" || f.Status != 429 || f.RetryAfterMs != 1000 {
		t.Fatalf("d: %+v; want error 429 with the limiter's retry_after_ms 1000", f)
	}
	sendJSON(t, c, map[string]string{"type": "cancel", "id": "a"})
	sendJSON(t, c, map[string]string{"type": "cancel", "id": "b"})
	waitFor(t, 3*time.Second, "a and b settled", func() bool { return lim.streams("t1") == 0 })
}

// On drain a socket refuses new requests, lets running ones finish within
// the drain timeout, ends the rest with an error frame, and closes with
// 1001; an idle socket closes at once.
func TestWSBridgeDrain(t *testing.T) {
	cfg := fastSim()
	cfg.StepBase = 20 * time.Millisecond
	sim, simURL := startSim(t, cfg)
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	idle := dialWS(t, wsURL(e), keyHeader())
	busy := dialWS(t, wsURL(e), keyHeader())
	request(t, busy, "short", `{"model":"sim-small","stream":true,"max_tokens":10,"messages":[{"role":"user","content":"x"}]}`)
	request(t, busy, "long", `{"model":"sim-small","stream":true,"max_tokens":5000,"messages":[{"role":"user","content":"x"}]}`)
	waitFor(t, 3*time.Second, "both running", func() bool { return sim.Stats().Running == 2 })

	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- e.server.Shutdown(ctx) }()

	if code, _ := closeCode(t, idle, 2*time.Second); code != websocket.CloseGoingAway {
		t.Fatalf("idle socket closed with %d; want 1001", code)
	}
	request(t, busy, "late", chatBody("")) // the idle socket's 1001 shows the drain has begun

	code, frames := closeCode(t, busy, 5*time.Second)
	if code != websocket.CloseGoingAway {
		t.Fatalf("busy socket closed with %d; want 1001", code)
	}
	term := map[string]wsFrame{}
	for _, f := range frames {
		if f.terminal() {
			term[f.ID] = f
		}
	}
	if f := term["short"]; f.Type != "done" {
		t.Fatalf("short: %+v; want done within the drain", f)
	}
	if f := term["late"]; f.Type != "error" || f.Status != 503 || f.Error.Code != "shutting_down" {
		t.Fatalf("late: %+v; want error 503 shutting_down", f)
	}
	if f := term["long"]; f.Type != "error" || f.Status != 503 || f.Error.Code != "shutting_down" {
		t.Fatalf("long: %+v; want error 503 shutting_down after the drain timeout", f)
	}
	select {
	case <-shut:
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return")
	}
	waitFor(t, 2*time.Second, "upstream cancelled", func() bool { return sim.Stats().Running == 0 })
}

// A socket with nothing in flight closes after the idle timeout; pongs do
// not keep it open.
func TestWSBridgeIdleTimeout(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	setWS(e, func(c *ws.Config) {
		c.IdleTimeout = 300 * time.Millisecond
		c.PingInterval = 50 * time.Millisecond
	}, nil)
	start := time.Now()
	c := dialWS(t, wsURL(e), keyHeader())
	pings := atomic.Int32{}
	c.SetPingHandler(func(data string) error {
		pings.Add(1)
		return c.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(time.Second))
	})
	if code, _ := closeCode(t, c, 5*time.Second); code != websocket.CloseNormalClosure {
		t.Fatalf("close code %d; want 1000", code)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("closed after %v; want ≥ the idle timeout", d)
	}
	if pings.Load() == 0 {
		t.Fatal("no pings received")
	}
}

// A socket may start request frames no faster than its request_rate
// (token bucket): beyond the burst, an error frame, and the socket stays
// usable.
func TestWSBridgeRequestRate(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	setWS(e, func(c *ws.Config) { c.RequestRate = 0.5; c.RequestBurst = 2 }, nil)
	c := dialWS(t, wsURL(e), keyHeader())
	for _, id := range []string{"a", "b", "c"} {
		request(t, c, id, chatBody(""))
	}
	got := map[string]wsFrame{}
	for len(got) < 3 {
		if f := readFrame(t, c, 5*time.Second); f.terminal() {
			got[f.ID] = f
		}
	}
	if got["a"].Type != "done" || got["b"].Type != "done" {
		t.Fatalf("a %+v, b %+v; want both done within the burst", got["a"], got["b"])
	}
	if f := got["c"]; f.Type != "error" || f.Status != 429 || f.Error.Code != "socket_request_rate" {
		t.Fatalf("c: %+v; want error 429 socket_request_rate", f)
	}
}
