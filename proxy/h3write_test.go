package proxy_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/proxy/listen"
)

// TestH3WriterResponses: the HTTP/3 listener's writer (which takes a
// flushed response's stream over from quic-go's, proxy/listen/http3write.go)
// answers every shape of response as quic-go's own writer does: whole
// bodies with Content-Length, HEAD, 204, bodies past the held 4 KiB, and
// flushed streams with their header, sniffed Content-Type, each write in
// order, and trailers (declared and http.TrailerPrefix).
func TestH3WriterResponses(t *testing.T) {
	big := strings.Repeat("b", 10_000)
	mux := http.NewServeMux()
	mux.HandleFunc("/small", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-A", "1")
		io.WriteString(w, "hello")
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, big[:3000])
		io.WriteString(w, big[3000:])
	})
	mux.HandleFunc("/nocontent", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Declared")
		w.Header().Set("X-B", "2")
		w.WriteHeader(http.StatusAccepted)
		rc := http.NewResponseController(w)
		for _, s := range []string{"<html>one ", "two ", "three"} {
			io.WriteString(w, s)
			if err := rc.Flush(); err != nil {
				t.Errorf("flush: %v", err)
			}
		}
		w.Header().Set("X-Declared", "d")
		w.Header().Set(http.TrailerPrefix+"X-Late", "l")
	})
	srv := &listen.Server{Handler: mux, HTTPSAddr: "127.0.0.1:0", TLSConfig: testTLSConfig(t)}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	t.Cleanup(func() { srv.Close() })
	base := "https://" + srv.Addr(listen.ListenerHTTP3)
	c := h3Client(t)
	get := func(method, path string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		return resp, string(b)
	}

	resp, body := get("GET", "/small")
	if resp.StatusCode != 200 || body != "hello" || resp.ContentLength != 5 || resp.Header.Get("X-A") != "1" ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("small: %d %q len %d header %v", resp.StatusCode, body, resp.ContentLength, resp.Header)
	}
	resp, body = get("HEAD", "/small")
	if resp.StatusCode != 200 || body != "" || resp.Header.Get("X-A") != "1" {
		t.Fatalf("HEAD: %d %q header %v", resp.StatusCode, body, resp.Header)
	}
	resp, body = get("GET", "/big")
	if resp.StatusCode != 200 || body != big {
		t.Fatalf("big: %d, %d bytes", resp.StatusCode, len(body))
	}
	resp, body = get("GET", "/nocontent")
	if resp.StatusCode != 204 || body != "" {
		t.Fatalf("204: %d %q", resp.StatusCode, body)
	}
	resp, body = get("GET", "/stream")
	if resp.StatusCode != 202 || body != "<html>one two three" || resp.Header.Get("X-B") != "2" ||
		resp.Header.Get("Date") == "" || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") ||
		resp.ContentLength != -1 {
		t.Fatalf("stream: %d %q len %d header %v", resp.StatusCode, body, resp.ContentLength, resp.Header)
	}
	if resp.Header.Get("X-Declared") != "" {
		t.Fatalf("the declared trailer's name went out in the header: %v", resp.Header)
	}
	if resp.Trailer.Get("X-Declared") != "d" || resp.Trailer.Get("X-Late") != "l" {
		t.Fatalf("stream trailer %v", resp.Trailer)
	}
}
