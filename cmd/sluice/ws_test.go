package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-proxy/sluice/proxy/listen"
)

// The embedded default serves the WebSocket bridge: a browser-style client
// (key in the subprotocol) streams a completion and gets done with usage.
func TestDefaultNodeWebSocket(t *testing.T) {
	n := startDefaultNode(t)

	d := websocket.Dialer{Subprotocols: []string{"sluice.v1", "sluice.key." + demoKey}, HandshakeTimeout: 5 * time.Second}
	c, _, err := d.Dial("ws://"+n.Server().Addr(listen.ListenerHTTP)+"/v1/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.WriteJSON(map[string]any{"type": "request", "id": "r1", "path": "/v1/chat/completions",
		"body": json.RawMessage(`{"model":"sim-small","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`)})
	chunks := 0
	for {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		var f struct {
			Type  string `json:"type"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := c.ReadJSON(&f); err != nil {
			t.Fatal(err)
		}
		if f.Type == "chunk" {
			chunks++
			continue
		}
		if f.Type != "done" || f.Usage == nil || f.Usage.CompletionTokens != 5 || chunks < 5 {
			t.Fatalf("got %+v after %d chunks; want done with 5 completion tokens", f, chunks)
		}
		break
	}
	resp, err := http.Get("http://" + n.Server().Addr(listen.ListenerAdmin) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `sluice_websocket_connections{mode="bridge"} 1`) {
		t.Fatalf("metrics do not count the open socket:\n%s", b)
	}
}
