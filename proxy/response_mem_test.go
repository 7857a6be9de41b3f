package proxy_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/proxy"
)

// TestAttackResponseBuffering: non-streamed responses are read whole (so a
// failure can still be retried), each up to max_response_bytes (64MiB);
// many large ones at once used to grow the process without bound. The node
// now bounds what all requests buffer together (response_memory_bytes): a
// response that would pass it gets 503, and what is released lets the next
// one through.
func TestAttackResponseBuffering(t *testing.T) {
	big := `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("a", 300<<10) + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
	small := `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		b, _ := io.ReadAll(r.Body)
		if strings.Contains(string(b), "big") {
			io.WriteString(w, big)
			return
		}
		io.WriteString(w, small)
	}))
	defer backend.Close()
	e := startEdge(t, edgeOpts{pool: poolOf(backend.URL), proxy: proxy.Config{ResponseMemoryBytes: 256 << 10}})
	ask := func(what string) (int, string) {
		resp := post(t, h1Client(), e.http+"/v1/chat/completions",
			`{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"`+what+`"}]}`)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	if st, b := ask("big"); st != http.StatusServiceUnavailable || !strings.Contains(b, "response_memory_exhausted") {
		t.Fatalf("a 300KiB response with 256KiB of response memory: %d %.200s; want 503", st, b)
	}
	if st, b := ask("small"); st != http.StatusOK {
		t.Fatalf("a small response after the refusal: %d %.200s", st, b)
	}
}
