package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// wsServer speaks the Sluice WebSocket bridge protocol for tests: each
// request frame is answered, concurrently, by chunk frames, then a done
// frame with usage and timing (or an error frame).
type wsServer struct {
	Interval    time.Duration
	ErrorStatus int // != 0: answer every request with an error frame
	DieAfter    int // > 0: close the socket after this many chunk frames in total
	// Cancelled, if not nil, gets a value (without blocking) for every
	// cancel frame received.
	Cancelled chan struct{}

	requests, sockets, cancels atomic.Int64
	inflight, maxInflight      atomic.Int64
	chunks                     atomic.Int64
	auth                       atomic.Value // string
}

type wsTestRequest struct {
	Type string          `json:"type"`
	ID   string          `json:"id"`
	Path string          `json:"path"`
	Body json.RawMessage `json:"body"`
}

func (s *wsServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.auth.Store(r.Header.Get("Authorization"))
	up := websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}
	c, err := up.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	s.sockets.Add(1)
	sc := &wsServerConn{s: s, c: c, cancels: map[string]context.CancelFunc{}}
	sc.readLoop()
}

// wsServerConn is one socket of the test server.
type wsServerConn struct {
	s       *wsServer
	c       *websocket.Conn
	wmu     sync.Mutex
	mu      sync.Mutex
	cancels map[string]context.CancelFunc
	wg      sync.WaitGroup
}

func (sc *wsServerConn) readLoop() {
	ctx, cancel := context.WithCancel(context.Background())
	defer func() {
		cancel()
		sc.wg.Wait()
		sc.c.Close()
	}()
	for {
		_, msg, err := sc.c.ReadMessage()
		if err != nil {
			return
		}
		var req wsTestRequest
		if json.Unmarshal(msg, &req) != nil {
			continue
		}
		switch req.Type {
		case "request":
			rctx, rcancel := context.WithCancel(ctx)
			sc.mu.Lock()
			sc.cancels[req.ID] = rcancel
			sc.mu.Unlock()
			sc.wg.Add(1)
			go sc.serve(rctx, req)
		case "cancel":
			sc.s.cancels.Add(1)
			select {
			case sc.s.Cancelled <- struct{}{}:
			default:
			}
			sc.mu.Lock()
			if f := sc.cancels[req.ID]; f != nil {
				f()
			}
			sc.mu.Unlock()
		}
	}
}

func (sc *wsServerConn) send(v string) error {
	sc.wmu.Lock()
	defer sc.wmu.Unlock()
	return sc.c.WriteMessage(websocket.TextMessage, []byte(v))
}

func (sc *wsServerConn) serve(ctx context.Context, req wsTestRequest) {
	defer sc.wg.Done()
	s := sc.s
	s.requests.Add(1)
	n := s.inflight.Add(1)
	defer s.inflight.Add(-1)
	for m := s.maxInflight.Load(); n > m && !s.maxInflight.CompareAndSwap(m, n); m = s.maxInflight.Load() {
	}
	var body requestBody
	if req.Path != DefaultPath || json.Unmarshal(req.Body, &body) != nil {
		_ = sc.send(fmt.Sprintf(`{"type":"error","id":%q,"status":400,"error":{"message":"bad request"}}`, req.ID))
		return
	}
	if s.ErrorStatus != 0 {
		_ = sc.send(fmt.Sprintf(`{"type":"error","id":%q,"status":%d,"error":{"message":"limited","type":"rate_limit"}}`, req.ID, s.ErrorStatus))
		return
	}
	_ = sc.send(fmt.Sprintf(`{"type":"chunk","id":%q,"data":{"choices":[{"delta":{"role":"assistant","content":""}}]}}`, req.ID))
	for i := range body.MaxTokens {
		if !sleepOrDone(ctx, s.Interval) {
			return
		}
		if s.DieAfter > 0 && s.chunks.Add(1) > int64(s.DieAfter) {
			sc.c.Close() // the read loop fails and ends the socket
			return
		}
		_ = sc.send(fmt.Sprintf(`{"type":"chunk","id":%q,"data":{"choices":[{"delta":{"content":"w%d "}}]}}`, req.ID, i))
	}
	_ = sc.send(fmt.Sprintf(`{"type":"done","id":%q,"usage":{"prompt_tokens":3,"completion_tokens":%d},`+
		`"timing":{"queue":1.25,"prefill":{"dur":2,"desc":"p"},"ttft":0.5,"decode":"n/a"}}`, req.ID, body.MaxTokens))
}

func startWS(t *testing.T, s *wsServer) string {
	t.Helper()
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestWebSocketBridge(t *testing.T) {
	srv := &wsServer{Interval: 5 * time.Millisecond}
	cfg := small(startWS(t, srv))
	cfg.Protocol, cfg.Concurrency, cfg.Requests, cfg.APIKey = WS, 4, 12, "sk-test"
	rep := mustRun(t, cfg)
	tr := rep.Targets[0]
	if tr.Counts.OK != 12 || srv.requests.Load() != 12 {
		t.Fatalf("counts %+v errors %+v, server saw %d", tr.Counts, tr.Errors, srv.requests.Load())
	}
	if srv.sockets.Load() != 1 {
		t.Errorf("%d sockets; want 1 (WSConns default)", srv.sockets.Load())
	}
	if srv.maxInflight.Load() < 2 {
		t.Errorf("at most %d requests in flight on the socket; want several multiplexed", srv.maxInflight.Load())
	}
	if got, _ := srv.auth.Load().(string); got != "Bearer sk-test" {
		t.Errorf("authorization %q", got)
	}
	var wantTokens int
	for _, r := range rep.Results {
		wantTokens += r.MaxTokens
		if !r.Done || r.TTFT <= 0 || len(r.ITL) != r.MaxTokens-1 || r.Status != 200 {
			t.Errorf("result %+v", r)
		}
	}
	if tr.OutputTokens != int64(wantTokens) {
		t.Errorf("tokens %d; want %d", tr.OutputTokens, wantTokens)
	}
	checkOrdered(t, "ttft", tr.TTFT)
	checkOrdered(t, "itl", tr.ITL)
	checkStages(t, tr.Stages, "network", "queue", "prefill", "ttft")
}

func TestWebSocketErrorFrames(t *testing.T) {
	srv := &wsServer{ErrorStatus: 429}
	cfg := small(startWS(t, srv))
	cfg.Protocol, cfg.Requests = WS, 3
	tr := mustRun(t, cfg).Targets[0]
	if tr.Counts.Status429 != 3 || tr.Counts.Truncated != 0 || tr.Errors[0].Msg != "limited" {
		t.Errorf("counts %+v errors %+v; want 3× 429", tr.Counts, tr.Errors)
	}
}

func TestWebSocketClosedMidStreamIsTruncation(t *testing.T) {
	srv := &wsServer{Interval: time.Millisecond, DieAfter: 3}
	cfg := small(startWS(t, srv))
	cfg.Protocol, cfg.Concurrency, cfg.Requests = WS, 2, 2
	tr := mustRun(t, cfg).Targets[0]
	if tr.Counts.Truncated != 2 || tr.Counts.OK != 0 {
		t.Errorf("counts %+v errors %+v; want 2 truncated", tr.Counts, tr.Errors)
	}
}

func TestWebSocketCancelFrame(t *testing.T) {
	srv := &wsServer{Interval: time.Second, Cancelled: make(chan struct{}, 1)}
	cfg := small(startWS(t, srv))
	cfg.Protocol, cfg.Requests, cfg.Timeout = WS, 1, 100*time.Millisecond
	tr := mustRun(t, cfg).Targets[0]
	if tr.Counts.Errors != 1 || tr.Errors[0].Class != ClassTimeout {
		t.Errorf("counts %+v errors %+v; want a timeout", tr.Counts, tr.Errors)
	}
	select {
	case <-srv.Cancelled:
	case <-time.After(5 * time.Second):
	}
	if srv.cancels.Load() != 1 {
		t.Error("no cancel frame reached the server")
	}
}

func TestWebSocketURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:1":      "ws://127.0.0.1:1" + DefaultWSPath,
		"https://127.0.0.1:1/api": "wss://127.0.0.1:1/api" + DefaultWSPath,
		"ws://127.0.0.1:1/socket": "ws://127.0.0.1:1/socket",
	} {
		c := Config{Target: in}.withDefaults()
		w, err := newWSRequester(c, in, nil, http.Header{"Content-Type": {"x"}, "Authorization": {"Bearer k"}})
		if err != nil {
			t.Fatal(err)
		}
		if w.url != want || w.header.Get("Content-Type") != "" || w.header.Get("Authorization") != "Bearer k" {
			t.Errorf("%s: url %s header %v; want %s", in, w.url, w.header, want)
		}
	}
	if !strings.HasPrefix(DefaultWSPath, "/") {
		t.Error("default ws path")
	}
}
