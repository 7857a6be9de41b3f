package proxy_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-proxy/sluice/proxy/ws"
)

// dialFrom is a gorilla dialer whose sockets leave from the loopback
// address ip (127.0.0.0/8 is all loopback on Linux), so one test can play
// several client addresses.
func dialFrom(ip string) *websocket.Dialer {
	nd := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &websocket.Dialer{HandshakeTimeout: 5 * time.Second,
		NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return nd.DialContext(ctx, network, addr)
		}}
}

// refusedWith dials expecting a refusal before the upgrade and checks its
// status and JSON error code.
func refusedWith(t *testing.T, d *websocket.Dialer, url string, status int, code string) {
	t.Helper()
	c, resp, err := d.Dial(url, keyHeader())
	if err == nil {
		c.Close()
		t.Fatalf("dial %s: upgraded; want %d %s", url, status, code)
	}
	if resp == nil {
		t.Fatalf("dial %s: %v; want %d %s", url, err, status, code)
	}
	defer resp.Body.Close()
	if resp.StatusCode != status || !containsCode(t, resp, code) {
		t.Fatalf("dial %s: got %d; want %d with code %q", url, resp.StatusCode, status, code)
	}
}

// containsCode reports whether resp's body is an OpenAI-shaped error
// with code.
func containsCode(t *testing.T, resp *http.Response, code string) bool {
	t.Helper()
	var body struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("refusal body is not JSON: %v", err)
	}
	return body.Error.Code == code
}

func waitSockets(t *testing.T, e *testEdge, want int) {
	t.Helper()
	waitFor(t, 5*time.Second, "open WebSocket count", func() bool {
		n, _, _ := e.handler.OpenWebSockets()
		return n == want
	})
}

// TestAttackWebSocketsPerAddr: one client address opening more sockets
// than proxy.websocket.max_sockets_per_addr (3), bridge and passthrough
// together, gets 429 too_many_websockets with a JSON error before the
// upgrade; a closed socket frees its place. Fails on the old code: every
// socket was upgraded.
func TestAttackWebSocketsPerAddr(t *testing.T) {
	_, beURL := newWSBackend(t)
	e := passthroughEdge(t, beURL)
	setWS(e, func(c *ws.Config) { c.MaxSocketsPerAddr = 3 }, nil)
	d := dialFrom("127.0.0.1")
	var held []*websocket.Conn
	for _, url := range []string{wsURL(e), wsURL(e), rtURL(e)} {
		c, _, err := d.Dial(url, keyHeader())
		if err != nil {
			t.Fatalf("dial %s: %v", url, err)
		}
		defer c.Close()
		held = append(held, c)
	}
	refusedWith(t, d, wsURL(e), http.StatusTooManyRequests, "too_many_websockets")
	refusedWith(t, d, rtURL(e), http.StatusTooManyRequests, "too_many_websockets")
	// Another address is not held back by this one.
	other, _, err := dialFrom("127.0.0.2").Dial(wsURL(e), keyHeader())
	if err != nil {
		t.Fatalf("a second address was refused: %v", err)
	}
	other.Close()
	held[2].Close()
	waitSockets(t, e, 2)
	c, _, err := d.Dial(rtURL(e), keyHeader())
	if err != nil {
		t.Fatalf("a closed socket did not free its place: %v", err)
	}
	c.Close()
}

// TestAttackWebSocketsPerTenant: one tenant's key used from several
// addresses cannot open more than proxy.websocket.max_sockets_per_tenant
// (2) sockets on the node.
func TestAttackWebSocketsPerTenant(t *testing.T) {
	_, beURL := newWSBackend(t)
	e := passthroughEdge(t, beURL)
	setWS(e, func(c *ws.Config) { c.MaxSocketsPerAddr = 1; c.MaxSocketsPerTenant = 2 }, nil)
	a, _, err := dialFrom("127.0.0.1").Dial(wsURL(e), keyHeader())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, _, err := dialFrom("127.0.0.2").Dial(rtURL(e), keyHeader())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	refusedWith(t, dialFrom("127.0.0.3"), wsURL(e), http.StatusTooManyRequests, "too_many_websockets")
	refusedWith(t, dialFrom("127.0.0.3"), rtURL(e), http.StatusTooManyRequests, "too_many_websockets")
	a.Close()
	waitSockets(t, e, 1)
	c, _, err := dialFrom("127.0.0.3").Dial(wsURL(e), keyHeader())
	if err != nil {
		t.Fatalf("a closed socket did not free the tenant's place: %v", err)
	}
	c.Close()
}

// TestWebSocketCountFreedOnEveryExit: sockets opened and closed in a loop
// (bridge and passthrough, client-closed and backend-closed), passthrough
// upgrades whose backend is down (502 or 503 before the upgrade) and refused
// upgrades all leave the count at 0.
func TestWebSocketCountFreedOnEveryExit(t *testing.T) {
	_, beURL := newWSBackend(t)
	e := passthroughEdge(t, beURL)
	setWS(e, func(c *ws.Config) { c.MaxSocketsPerAddr = 4 }, nil)
	d := dialFrom("127.0.0.1")
	for i := 0; i < 20; i++ {
		for _, url := range []string{wsURL(e), rtURL(e)} {
			c, _, err := d.Dial(url, keyHeader())
			if err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
			if i%2 == 1 && url == rtURL(e) {
				c.WriteMessage(websocket.TextMessage, []byte("close 1000")) // the backend closes
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				for {
					if _, _, err := c.ReadMessage(); err != nil {
						break
					}
				}
			}
			c.Close()
		}
	}
	waitSockets(t, e, 0)
	down := passthroughEdge(t, closedURL(t))
	for i := 0; i < 5; i++ {
		_, resp, err := d.Dial(rtURL(down), keyHeader())
		if err == nil || resp == nil || resp.StatusCode < 500 {
			t.Fatalf("backend down: got %v %v; want a 5xx before the upgrade", resp, err)
		}
		resp.Body.Close()
	}
	waitSockets(t, down, 0)
	if _, _, err := d.Dial(wsURL(e), nil); err == nil {
		t.Fatal("a socket without a key was upgraded")
	}
	waitSockets(t, e, 0)
}
