package proxy_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/routing"
)

// pathTrickEdge serves an unaccounted kind: sse route for /sse/ and the
// OpenAI route for /v1/, both on one backend that records what it gets.
func pathTrickEdge(t *testing.T) (*testEdge, *recordingBackend) {
	t.Helper()
	be := &recordingBackend{body: "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n"}
	srv := httptest.NewServer(be) // no ServeMux: the backend sees the path as sent
	t.Cleanup(srv.Close)
	e := startEdge(t, edgeOpts{pool: poolOf(srv.URL), routes: []testRoute{
		{RouteConfig: routing.RouteConfig{Path: "/sse/", Pool: "p"}, RoutePolicy: proxy.RoutePolicy{Kind: proxy.KindSSE}},
		{RouteConfig: routing.RouteConfig{Path: "/v1/", Pool: "p"}},
	}})
	return e, be
}

// pathTricks climb out of the sse route into the chat endpoint.
var pathTricks = []string{
	"/sse/../v1/chat/completions",
	"/sse/%2e%2e/v1/chat/completions",
	"/sse/%2E./v1/chat/completions",
	"/sse/..%2fv1/chat/completions",
	"/sse/x%2f..%2f..%2fv1/chat/completions",
	"/sse/./../v1/chat/completions",
	"/sse//../v1/chat/completions",
	"/sse/..\\v1/chat/completions",
	"/sse/%5c..%5cv1/chat/completions",
}

// TestPathTrickEscapesSSERoute: a dot-segment path matched against the
// sse route must never reach the backend (which resolves it to its chat
// endpoint, unaccounted); it is refused with 400 over every protocol.
func TestPathTrickEscapesSSERoute(t *testing.T) {
	e, be := pathTrickEdge(t)
	clients := []struct {
		name string
		c    *http.Client
		base string
	}{
		{"h1", h1Client(), e.http}, {"h2c", h2cClient(), e.http}, {"h2", h2Client(), e.https}, {"h3", h3Client(t), e.h3},
	}
	for _, cl := range clients {
		for _, p := range pathTricks {
			resp := post(t, cl.c, cl.base+p, chatBody(""))
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("%s %s: got %d %s; want 400", cl.name, p, resp.StatusCode, body)
			}
		}
	}
	// The plain path still works, and reaches the backend as sent.
	resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("clean path: got %d; want 200", resp.StatusCode)
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	if len(be.reqs) != 1 || be.reqs[0].URL.Path != "/v1/chat/completions" {
		var got []string
		for _, r := range be.reqs {
			got = append(got, r.URL.RawPath+" "+r.URL.Path)
		}
		t.Fatalf("backend got %q; want only the clean request", got)
	}
}

// TestPathTrickInBridgeFrame: the same trick inside a WebSocket bridge
// request frame gets an error frame with status 400, not the backend.
func TestPathTrickInBridgeFrame(t *testing.T) {
	e, be := pathTrickEdge(t)
	c := dialWS(t, wsURL(e), keyHeader())
	for i, p := range pathTricks {
		id := "r" + string(rune('a'+i))
		sendJSON(t, c, map[string]any{"type": "request", "id": id, "path": p, "body": json.RawMessage(chatBody(""))})
		f := readFrame(t, c, 5*time.Second)
		if f.Type != "error" || f.Status != http.StatusBadRequest {
			t.Errorf("frame path %s: got %+v; want an error frame with status 400", p, f)
		}
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	if len(be.reqs) != 0 {
		t.Fatalf("backend got %d requests; want none", len(be.reqs))
	}
}
