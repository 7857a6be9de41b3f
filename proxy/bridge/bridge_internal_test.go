package bridge

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/proxy/ws"
)

func TestParseClientFrame(t *testing.T) {
	cases := []struct {
		msg, id, err string
	}{
		{`{"type":"request","id":"r1","path":"/v1/chat/completions","body":{"model":"m"}}`, "r1", ""},
		{`{"type":"request","id":"r1","method":"GET","path":"/v1/models"}`, "r1", ""},
		{`{"type":"cancel","id":"r1"}`, "r1", ""},
		{`{"type":"request","id":"r1","path":"/v1/x?a=b","body":{}}`, "r1", ""},
		{`{"type":"request","id":"r1",`, "", "not valid JSON"},
		{`[1,2]`, "", "not valid JSON"},
		{`{"type":"request","id":7}`, "", "not valid JSON"},
		{`{"type":"request","id":"","path":"/v1/x","body":{}}`, "", `non-empty "id"`},
		{`{"type":"request","id":"` + strings.Repeat("x", 129) + `"}`, "", "at most 128"},
		{`{"id":"a"}`, "a", `needs a "type"`},
		{`{"type":"nope","id":"a"}`, "a", "unknown frame type"},
		{`{"type":"request","id":"a","method":"PUT","path":"/v1/x","body":{}}`, "a", "POST or GET"},
		{`{"type":"request","id":"a","body":{}}`, "a", `needs a "path"`},
		{`{"type":"request","id":"a","path":"//evil/x","body":{}}`, "a", "absolute path"},
		{`{"type":"request","id":"a","path":"v1/x","body":{}}`, "a", "absolute path"},
		{`{"type":"request","id":"a","path":"/v1/ws","body":{}}`, "a", "WebSocket endpoint"},
		{`{"type":"request","id":"a","path":"/v1/x","body":"hi"}`, "a", "JSON object"},
		{`{"type":"request","id":"a","path":"/v1/x"}`, "a", "JSON object"},
	}
	for _, tc := range cases {
		f, err := parseClientFrame([]byte(tc.msg), "/v1/ws")
		if f.ID != tc.id {
			t.Errorf("%s: id %q; want %q", tc.msg, f.ID, tc.id)
		}
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.msg, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Message, tc.err)):
			t.Errorf("%s: got %v; want an error containing %q", tc.msg, err, tc.err)
		case err == nil && f.Type == frameRequest && f.url == nil:
			t.Errorf("%s: no parsed url", tc.msg)
		}
	}
}

func TestEventEnd(t *testing.T) {
	cases := []struct {
		in   string
		want int
	}{
		{"data: x\n\n", 9},
		{"data: x\r\n\r\n", 11},
		{"event: a\ndata: x\n\ndata: y\n\n", 18},
		{"data: x\n", -1},
		{"data: x", -1},
		{"", -1},
		{"\n\n", 2},
	}
	for _, tc := range cases {
		if got := eventEnd([]byte(tc.in)); got != tc.want {
			t.Errorf("eventEnd(%q) = %d; want %d", tc.in, got, tc.want)
		}
	}
}

func TestAppendChunk(t *testing.T) {
	p := chunkPrefix(`r"1`)
	got := string(appendChunk(nil, p, "", []byte(`{"a":1}`)))
	if want := `{"type":"chunk","id":"r\"1","data":{"a":1}}`; got != want {
		t.Errorf("got %s; want %s", got, want)
	}
	got = string(appendChunk(nil, p, "update", []byte(`not json","type":"done`)))
	if want := `{"type":"chunk","id":"r\"1","event":"update","data":"not json\",\"type\":\"done"}`; got != want {
		t.Errorf("got %s; want %s", got, want)
	}
	if !json.Valid([]byte(got)) {
		t.Errorf("%s is not JSON", got)
	}
}

// testConn is a wsConn whose send queue the test reads.
func testConn(queue int) *wsConn {
	return &wsConn{b: &Bridge{}, cfg: ws.Config{SlowClientDeadline: 50 * time.Millisecond},
		out: make(chan *[]byte, queue), writerGone: make(chan struct{})}
}

func queued(c *wsConn) []string {
	var out []string
	for {
		select {
		case f := <-c.out:
			out = append(out, string(*f))
		default:
			return out
		}
	}
}

// A raw stream written in arbitrary pieces becomes one chunk per event.
func TestBridgeSinkSplitsEvents(t *testing.T) {
	c := testConn(16)
	rq := &wsRequest{c: c, id: "r", prefix: chunkPrefix("r"), ctx: context.Background()}
	w := &bridgeSink{rq: rq, hdr: http.Header{"Content-Type": {"text/event-stream"}}}
	w.Start(200, true)
	for _, p := range []string{"data: {\"a\"", ":1}\n", "\nevent: tick\ndata: 2\n\n: comment\n\ndata: [DONE]\n\nda", "ta: x\n\n"} {
		if n, err := w.Raw([]byte(p)); err != nil || n != len(p) {
			t.Fatalf("Raw(%q) = %d, %v", p, n, err)
		}
	}
	got := queued(c)
	want := []string{
		`{"type":"chunk","id":"r","data":{"a":1}}`,
		`{"type":"chunk","id":"r","event":"tick","data":2}`,
		`{"type":"chunk","id":"r","data":"[DONE]"}`, // raw streams keep [DONE]
		`{"type":"chunk","id":"r","data":"x"}`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("frames:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// OpenAI streams drop [DONE] and the pipeline's error event (the terminal
// frame says them); a full queue past the deadline fails the write.
func TestBridgeSinkOpenAIAndSlowClient(t *testing.T) {
	c := testConn(1)
	rq := &wsRequest{c: c, id: "r", prefix: chunkPrefix("r"), ctx: context.Background()}
	w := &bridgeSink{rq: rq, hdr: http.Header{"Content-Type": {"text/event-stream"}}}
	w.Start(200, true)
	event := func(ev string) error {
		_, err := w.Event([]byte(ev), proxy.EventData([]byte(ev)))
		return err
	}
	for _, ev := range []string{"data: [DONE]\n\n", "event: error\ndata: {\"error\":{}}\n\n", "data: {\"n\":1}\n\n"} {
		if err := event(ev); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.Error(http.StatusBadGateway, []byte(`{"error":{}}`)); err != nil {
		t.Fatal(err)
	}
	if len(c.out) != 1 {
		t.Fatalf("%d frames queued; want 1", len(c.out))
	}
	start := time.Now()
	if err := event("data: {\"n\":2}\n\n"); err != errSlowClient {
		t.Fatalf("write to a full queue: %v; want errSlowClient", err)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("gave up after %v; want the slow-client deadline", d)
	}
	if err := event("data: {}\n\n"); err != errSlowClient {
		t.Fatalf("write after failure: %v; want the same error", err)
	}
	term := w.terminal(&proxy.Outcome{RequestID: "x"})
	if !strings.Contains(string(term), `"code":"slow_client"`) || !strings.Contains(string(term), `"status":408`) {
		t.Fatalf("terminal %s; want a slow_client error", term)
	}
	if q := c.queued.Load(); q != int64(len(`{"type":"chunk","id":"r","data":{"n":1}}`)) {
		t.Fatalf("queued bytes %d after a refused frame; want only the queued frame's", q)
	}
}

func TestBridgeSinkErrorFrames(t *testing.T) {
	c := testConn(4)
	rq := &wsRequest{c: c, id: "r", prefix: chunkPrefix("r"), ctx: context.Background()}
	w := &bridgeSink{rq: rq, hdr: http.Header{}}
	w.hdr.Set("Retry-After", "2")
	w.Error(429, []byte(`{"error":{"message":"slow down","type":"rate_limit_exceeded","code":"rate_limit_exceeded"}}`))
	var f errorFrame
	if err := json.Unmarshal(w.terminal(&proxy.Outcome{}), &f); err != nil {
		t.Fatal(err)
	}
	if f.Type != "error" || f.ID != "r" || f.Status != 429 || f.RetryAfterMs != 2000 || !strings.Contains(string(f.Error), "slow down") {
		t.Fatalf("got %+v (%s)", f, f.Error)
	}

	w = &bridgeSink{rq: rq, hdr: http.Header{"Content-Type": {"text/event-stream"}}}
	w.Start(200, true)
	// A timeout (as a stalled stream's) maps through proxy.ErrorOf to 504.
	if err := json.Unmarshal(w.terminal(&proxy.Outcome{Err: context.DeadlineExceeded}), &f); err != nil {
		t.Fatal(err)
	}
	if f.Status != 504 || !strings.Contains(string(f.Error), "upstream_timeout") {
		t.Fatalf("stream failure: %+v (%s); want 504 upstream_timeout", f, f.Error)
	}
	rq.cancelled.Store(true)
	if err := json.Unmarshal(w.terminal(&proxy.Outcome{Err: context.Canceled}), &f); err != nil {
		t.Fatal(err)
	}
	if f.Status != 499 || !strings.Contains(string(f.Error), `"cancelled"`) {
		t.Fatalf("cancelled: %+v (%s)", f, f.Error)
	}
}

// A generic stream that fails after it started relays its error event as
// a chunk, as its other events; an OpenAI stream's error is left to the
// terminal frame.
func TestBridgeSinkRawStreamError(t *testing.T) {
	c := testConn(4)
	rq := &wsRequest{c: c, id: "r", prefix: chunkPrefix("r"), ctx: context.Background()}
	s := &bridgeSink{rq: rq, hdr: http.Header{}}
	s.Start(200, true)
	s.Raw(nil)
	s.Raw([]byte("data: 1\n\n"))
	s.Error(502, []byte(`{"error":{"code":"upstream_stream_broken"}}`))
	got := strings.Join(queued(c), "\n")
	want := `{"type":"chunk","id":"r","data":1}` + "\n" +
		`{"type":"chunk","id":"r","event":"error","data":{"error":{"code":"upstream_stream_broken"}}}`
	if got != want {
		t.Fatalf("frames:\n%s\nwant:\n%s", got, want)
	}
}

func TestWSKey(t *testing.T) {
	r := &http.Request{Header: http.Header{"Sec-Websocket-Protocol": {"sluice.v1, sluice.key.sk-abc"}}, URL: &url.URL{}}
	if k, proto := proxy.WebSocketKey(r); k != "sk-abc" || !proto {
		t.Fatalf("got %q %v; want the subprotocol key", k, proto)
	}
	r.Header.Set("Authorization", "Bearer sk-hdr")
	if k, proto := proxy.WebSocketKey(r); k != "sk-hdr" || proto {
		t.Fatalf("got %q %v; want the header key first", k, proto)
	}
	h := bridgeHeader(http.Header{"Sec-Websocket-Protocol": {"sluice.v1, sluice.key.sk-abc"}, "Sec-Websocket-Key": {"x"},
		"X-Request-Id": {"same"}, "Cookie": {"c=1"}}, "sk-abc", true)
	if h.Get("Authorization") != "Bearer sk-abc" || h.Get("Sec-Websocket-Protocol") != "" || h.Get("X-Request-Id") != "" ||
		h.Get("Sec-Websocket-Key") != "" || h.Get("Cookie") != "c=1" {
		t.Fatalf("bridge header %v", h)
	}
}

func FuzzParseClientFrame(f *testing.F) {
	f.Add([]byte(`{"type":"request","id":"r1","path":"/v1/chat/completions","body":{"model":"m"}}`))
	f.Add([]byte(`{"type":"cancel","id":"r1"}`))
	f.Add([]byte(`{"type":"request","id":"a","path":"/%zz","body":{}}`))
	f.Fuzz(func(t *testing.T, msg []byte) {
		fr, err := parseClientFrame(msg, "/v1/ws")
		if err == nil && fr.Type == frameRequest && (fr.url == nil || !strings.HasPrefix(fr.Path, "/")) {
			t.Fatalf("accepted %q without a path", msg)
		}
		b := newErrorFrame(fr.ID, "", badFrame("x"))
		if !json.Valid(b) {
			t.Fatalf("error frame %s is not JSON", b)
		}
	})
}

func FuzzBridgeSinkRaw(f *testing.F) {
	f.Add([]byte("data: {\"a\":1}\n\nevent: x\ndata: y\r\n\r\n"), 3)
	f.Add([]byte("data: [DONE]\n\n"), 1)
	f.Fuzz(func(t *testing.T, stream []byte, cut int) {
		c := testConn(1 << 12)
		rq := &wsRequest{c: c, id: "r", prefix: chunkPrefix("r"), ctx: context.Background()}
		w := &bridgeSink{rq: rq, hdr: http.Header{"Content-Type": {"text/event-stream"}}}
		w.Start(200, true)
		if cut < 0 || cut > len(stream) {
			cut = len(stream) / 2
		}
		w.Raw(stream[:cut])
		w.Raw(stream[cut:])
		for _, fr := range queued(c) {
			if !json.Valid([]byte(fr)) {
				t.Fatalf("frame %s is not JSON", fr)
			}
		}
	})
}
