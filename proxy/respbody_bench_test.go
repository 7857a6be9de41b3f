package proxy_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkNonStreamedResponse sends non-streamed requests one after the
// other through Sluice over HTTP/1.1 keep-alive: an op is one request.
// "small" is a typical chat.completion (answered whole, as before), "1MiB"
// a body streamed through the 32KiB window with its usage read on the way.
func BenchmarkNonStreamedResponse(b *testing.B) {
	big := hugeHead + strings.Repeat("a", 1<<20) + hugeTail
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("big") == "1" {
			io.WriteString(w, big)
			return
		}
		io.WriteString(w, smallAnswer)
	}))
	b.Cleanup(backend.Close)
	e := fullEdge(b, poolOf(backend.URL))
	body := `{"model":"sim-small","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	for _, c := range []struct{ name, query string }{{"small", ""}, {"1MiB", "?big=1"}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodPost, e.http+"/v1/chat/completions"+c.query, strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+testKey)
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
		})
	}
}
