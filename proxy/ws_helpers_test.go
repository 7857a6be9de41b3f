package proxy_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/proxy/ws"
)

// wsFrame is a frame from the bridge, as a client decodes it.
type wsFrame struct {
	Type      string          `json:"type"`
	ID        string          `json:"id"`
	RequestID string          `json:"request_id"`
	Event     string          `json:"event"`
	Data      json.RawMessage `json:"data"`
	Usage     *struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
		TotalTokens      int64 `json:"total_tokens"`
	} `json:"usage"`
	Timing map[string]float64 `json:"timing"`
	Status int                `json:"status"`
	Error  *struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
	RetryAfterMs int64 `json:"retry_after_ms"`
}

func (f wsFrame) terminal() bool { return f.Type == "done" || f.Type == "error" }

func wsURL(e *testEdge) string { return "ws" + strings.TrimPrefix(e.http, "http") + "/v1/ws" }

func keyHeader() http.Header { return http.Header{"Authorization": {"Bearer " + testKey}} }

// dialWS opens a socket, failing the test unless the upgrade succeeds.
func dialWS(t testing.TB, url string, hdr http.Header, protocols ...string) *websocket.Conn {
	t.Helper()
	d := websocket.Dialer{Subprotocols: protocols, HandshakeTimeout: 5 * time.Second}
	c, resp, err := d.Dial(url, hdr)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("dial %s: %v (status %d)", url, err, status)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// dialRefused dials expecting a refusal before the upgrade; it returns the
// status and the decoded OpenAI error.
func dialRefused(t testing.TB, url string, hdr http.Header, protocols ...string) (int, string) {
	t.Helper()
	d := websocket.Dialer{Subprotocols: protocols, HandshakeTimeout: 5 * time.Second}
	c, resp, err := d.Dial(url, hdr)
	if err == nil {
		c.Close()
		t.Fatalf("dial %s: upgraded; want a refusal", url)
	}
	if resp == nil {
		t.Fatalf("dial %s: %v; want an HTTP refusal", url, err)
	}
	defer resp.Body.Close()
	var body struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &body); err != nil {
		t.Fatalf("refusal body %q is not JSON: %v", raw, err)
	}
	return resp.StatusCode, body.Error.Code
}

func sendJSON(t testing.TB, c *websocket.Conn, v any) {
	t.Helper()
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := c.WriteJSON(v); err != nil {
		t.Fatalf("write: %v", err)
	}
}

// request sends a request frame for the chat completions path.
func request(t testing.TB, c *websocket.Conn, id, body string) {
	t.Helper()
	sendJSON(t, c, map[string]any{"type": "request", "id": id, "path": "/v1/chat/completions", "body": json.RawMessage(body)})
}

func readFrame(t testing.TB, c *websocket.Conn, timeout time.Duration) wsFrame {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(timeout))
	var f wsFrame
	mt, msg, err := c.ReadMessage()
	if err != nil {
		t.Fatalf("%v read: %v", time.Now().Format("15:04:05.000"), err)
	}
	if mt != websocket.TextMessage {
		t.Fatalf("got message type %d; want text", mt)
	}
	if err := json.Unmarshal(msg, &f); err != nil {
		t.Fatalf("frame %q is not JSON: %v", msg, err)
	}
	return f
}

// readUntilTerminal reads frames until n requests have ended; it returns
// every frame in arrival order.
func readUntilTerminal(t testing.TB, c *websocket.Conn, n int) []wsFrame {
	t.Helper()
	var out []wsFrame
	for ended := 0; ended < n; {
		f := readFrame(t, c, 10*time.Second)
		out = append(out, f)
		if f.terminal() {
			ended++
		}
	}
	return out
}

// closeCode reads until the socket closes and returns the close code.
func closeCode(t testing.TB, c *websocket.Conn, timeout time.Duration) (int, []wsFrame) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(timeout))
	var frames []wsFrame
	for {
		_, msg, err := c.ReadMessage()
		if err != nil {
			if ce, ok := err.(*websocket.CloseError); ok {
				return ce.Code, frames
			}
			t.Fatalf("read: %v; want a close frame", err)
		}
		var f wsFrame
		json.Unmarshal(msg, &f)
		frames = append(frames, f)
	}
}

// setWS changes the edge's WebSocket settings and, when lim is set, puts
// the real local limiter in with the test tenant's limits.
func setWS(e *testEdge, mod func(*ws.Config), lim *concLimiter) {
	st := *e.handler.State()
	if mod != nil {
		st.Config.WebSocket = proxy.Config{}.WithDefaults().WebSocket
		mod(&st.Config.WebSocket)
	}
	if lim != nil {
		st.Limiter = lim.Local
		st.Tenants = proxy.NewTenants([]proxy.TenantConfig{
			{ID: "t1", Keys: []string{proxy.HashKey(testKey)}, Limits: lim.limits},
		})
	}
	e.handler.Swap(&st)
}

// concLimiter is the real local limiter with a concurrency limit, and a
// view of a tenant's streams in flight.
type concLimiter struct {
	*limiter.Local
	limits limiter.Limits
}

func newConcLimiter(max int) *concLimiter {
	return &concLimiter{Local: limiter.NewLocal(1), limits: limiter.Limits{MaxConcurrency: max}}
}

// streams is the tenant's concurrency leases held now.
func (l *concLimiter) streams(tenant string) int {
	st, err := l.Snapshot(context.Background(), tenant, l.limits)
	if err != nil {
		return -1
	}
	return int(st.InFlight)
}
