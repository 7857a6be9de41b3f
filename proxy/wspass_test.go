package proxy_test

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/proxy/ws"
	"github.com/sluice-proxy/sluice/routing"
)

// wsBackend is a realtime-style backend: it echoes messages, answers
// "stream N" with N messages, and "close CODE" by closing with that code.
type wsBackend struct {
	mu     sync.Mutex
	reqs   []*http.Request
	closes chan int // close codes received from Sluice
}

func newWSBackend(t *testing.T) (*wsBackend, string) {
	b := &wsBackend{closes: make(chan int, 16)}
	srv := httptest.NewServer(b)
	t.Cleanup(srv.Close)
	return b, srv.URL
}

func (b *wsBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	b.reqs = append(b.reqs, r)
	b.mu.Unlock()
	up := websocket.Upgrader{Subprotocols: []string{"realtime.v1"}}
	c, err := up.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer c.Close()
	for {
		mt, msg, err := c.ReadMessage()
		if err != nil {
			code := -1
			if ce, ok := err.(*websocket.CloseError); ok {
				code = ce.Code
			}
			b.closes <- code
			return
		}
		s := string(msg)
		switch {
		case strings.HasPrefix(s, "stream "):
			n, _ := strconv.Atoi(strings.TrimPrefix(s, "stream "))
			for i := 0; i < n; i++ {
				c.WriteMessage(websocket.TextMessage, []byte("m"+strconv.Itoa(i)))
			}
		case strings.HasPrefix(s, "close "):
			code, _ := strconv.Atoi(strings.TrimPrefix(s, "close "))
			c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(code, "bye"))
		default:
			c.WriteMessage(mt, msg)
		}
	}
}

func (b *wsBackend) last() *http.Request {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.reqs[len(b.reqs)-1]
}

func passthroughEdge(t *testing.T, backendURL string) *testEdge {
	return startEdge(t, edgeOpts{pool: poolOf(backendURL), routes: []testRoute{
		{RouteConfig: routing.RouteConfig{Path: "/v1/realtime", Pool: "p"}, RoutePolicy: proxy.RoutePolicy{Kind: proxy.KindWebSocket}},
	}})
}

func rtURL(e *testEdge) string {
	return "ws" + strings.TrimPrefix(e.http, "http") + "/v1/realtime?session=abc"
}

func expectMessage(t *testing.T, c *websocket.Conn, wantType int, want string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	mt, msg, err := c.ReadMessage()
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if mt != wantType || string(msg) != want {
		t.Fatalf("got %d %q; want %d %q", mt, msg, wantType, want)
	}
}

func TestWSPassthroughRelaysBothWays(t *testing.T) {
	be, beURL := newWSBackend(t)
	e := passthroughEdge(t, beURL)
	lim := newConcLimiter(1)
	setWS(e, nil, lim)

	d := websocket.Dialer{Subprotocols: []string{"realtime.v1"}}
	c, resp, err := d.Dial(rtURL(e), keyHeader())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := resp.Header.Get("Sec-Websocket-Protocol"); got != "realtime.v1" {
		t.Fatalf("subprotocol %q; want the backend's realtime.v1", got)
	}
	if resp.Header.Get("X-Request-Id") == "" {
		t.Fatal("no X-Request-Id on the upgrade response")
	}
	r := be.last()
	if r.URL.Path != "/v1/realtime" || r.URL.Query().Get("session") != "abc" || r.Header.Get("Authorization") != "" ||
		r.Header.Get("X-Forwarded-For") != "127.0.0.1" || r.Header.Get("X-Request-Id") == "" {
		t.Fatalf("backend saw %s %v", r.URL, r.Header)
	}

	if err := c.WriteMessage(websocket.TextMessage, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	expectMessage(t, c, websocket.TextMessage, "hello")
	c.WriteMessage(websocket.BinaryMessage, []byte{0, 1, 2})
	expectMessage(t, c, websocket.BinaryMessage, "\x00\x01\x02")
	c.WriteMessage(websocket.TextMessage, []byte("stream 50"))
	for i := 0; i < 50; i++ {
		expectMessage(t, c, websocket.TextMessage, "m"+strconv.Itoa(i))
	}

	// The session is one stream for the tenant.
	if n := lim.streams("t1"); n != 1 {
		t.Fatalf("tenant streams %d during the session; want 1", n)
	}
	if status, _ := dialRefused(t, rtURL(e), keyHeader()); status != 429 {
		t.Fatalf("second session over the tenant's limit: %d; want 429 before the upgrade", status)
	}

	c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "done"))
	select {
	case code := <-be.closes:
		if code != websocket.CloseNormalClosure {
			t.Fatalf("backend got close %d; want 1000", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the client's close did not reach the backend")
	}
	waitFor(t, 3*time.Second, "stream settled", func() bool { return lim.streams("t1") == 0 })
}

func TestWSPassthroughBackendClose(t *testing.T) {
	_, beURL := newWSBackend(t)
	e := passthroughEdge(t, beURL)
	c := dialWS(t, rtURL(e), keyHeader())
	c.WriteMessage(websocket.TextMessage, []byte("close 4001"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _, err := c.ReadMessage()
	ce, ok := err.(*websocket.CloseError)
	if !ok || ce.Code != 4001 || ce.Text != "bye" {
		t.Fatalf("got %v; want the backend's close 4001 bye", err)
	}
}

// Browsers authenticate with the subprotocol key; the backend never sees
// Sluice's subprotocols, and sluice.v1 is echoed when the backend chose none.
func TestWSPassthroughSubprotocolKey(t *testing.T) {
	be, beURL := newWSBackend(t)
	e := passthroughEdge(t, beURL)
	c := dialWS(t, rtURL(e), nil, "sluice.v1", "sluice.key."+testKey)
	if got := c.Subprotocol(); got != "sluice.v1" {
		t.Fatalf("subprotocol %q; want sluice.v1", got)
	}
	if got := be.last().Header.Get("Sec-Websocket-Protocol"); strings.Contains(got, "sluice") {
		t.Fatalf("backend saw subprotocols %q", got)
	}
	c.WriteMessage(websocket.TextMessage, []byte("ping?"))
	expectMessage(t, c, websocket.TextMessage, "ping?")

	if status, code := dialRefused(t, rtURL(e), nil, "sluice.v1", "sluice.key.sk-wrong"); status != 401 || code != "invalid_api_key" {
		t.Fatalf("bad key: %d %q; want 401 invalid_api_key", status, code)
	}
}

func TestWSPassthroughBackendDown(t *testing.T) {
	e := passthroughEdge(t, closedURL(t))
	if status, code := dialRefused(t, rtURL(e), keyHeader()); status != 502 || code != "upstream_unreachable" {
		t.Fatalf("got %d %q; want 502 upstream_unreachable before the upgrade", status, code)
	}
	// A backend that is not a WebSocket endpoint.
	srv := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(srv.Close)
	e = passthroughEdge(t, srv.URL)
	if status, code := dialRefused(t, rtURL(e), keyHeader()); status != 502 || code != "upstream_refused_upgrade" {
		t.Fatalf("got %d %q; want 502 upstream_refused_upgrade", status, code)
	}
}

// After the drain timeout a passthrough session is closed with 1001 on
// both sides.
func TestWSPassthroughDrain(t *testing.T) {
	be, beURL := newWSBackend(t)
	e := passthroughEdge(t, beURL)
	c := dialWS(t, rtURL(e), keyHeader())
	c.WriteMessage(websocket.TextMessage, []byte("hi"))
	expectMessage(t, c, websocket.TextMessage, "hi")

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	go e.server.Shutdown(ctx)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _, err := c.ReadMessage()
	if !websocket.IsCloseError(err, websocket.CloseGoingAway) {
		t.Fatalf("client got %v; want close 1001", err)
	}
	select {
	case code := <-be.closes:
		if code != websocket.CloseGoingAway {
			t.Fatalf("backend got close %d; want 1001", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("backend not closed")
	}
}

func TestWSPassthroughOversized(t *testing.T) {
	be, beURL := newWSBackend(t)
	e := passthroughEdge(t, beURL)
	setWS(e, func(c *ws.Config) { c.MaxMessageBytes = 1 << 10 }, nil)
	c := dialWS(t, rtURL(e), keyHeader())
	c.WriteMessage(websocket.TextMessage, []byte(strings.Repeat("x", 4<<10)))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _, err := c.ReadMessage()
	if !websocket.IsCloseError(err, websocket.CloseMessageTooBig) {
		t.Fatalf("client got %v; want close 1009", err)
	}
	select {
	case code := <-be.closes:
		if code != websocket.CloseMessageTooBig {
			t.Fatalf("backend got close %d; want 1009", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("backend not closed")
	}
}

// A wss:// backend is reached with the pool's upstream TLS (here: its CA).
func TestWSPassthroughTLSBackend(t *testing.T) {
	be := &wsBackend{closes: make(chan int, 16)}
	srv := httptest.NewTLSServer(be)
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(ca, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	pool := poolOf(srv.URL)
	pool.TLS = &routing.UpstreamTLS{CAFile: ca}
	e := startEdge(t, edgeOpts{pool: pool, routes: []testRoute{
		{RouteConfig: routing.RouteConfig{Path: "/v1/realtime", Pool: "p"}, RoutePolicy: proxy.RoutePolicy{Kind: proxy.KindWebSocket}},
	}})
	c := dialWS(t, rtURL(e), keyHeader())
	c.WriteMessage(websocket.TextMessage, []byte("over tls"))
	expectMessage(t, c, websocket.TextMessage, "over tls")
	if r := be.last(); r.TLS == nil {
		t.Fatal("the backend was not reached over TLS")
	}

	// Without the CA the backend's certificate is refused: 502 before the
	// client is upgraded.
	e = passthroughEdge(t, srv.URL)
	if status, _ := dialRefused(t, rtURL(e), keyHeader()); status != 502 {
		t.Fatalf("untrusted backend: %d; want 502", status)
	}
}
