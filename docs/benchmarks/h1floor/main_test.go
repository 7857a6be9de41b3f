package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestRelayKeepAlive relays Content-Length and chunked (flushed) answers of
// a real net/http backend over one kept client connection.
func TestRelayKeepAlive(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/stream" {
			for i := 0; i < 3; i++ {
				fmt.Fprintf(w, "data: %s %d\n\n", b, i)
				w.(http.Flusher).Flush()
			}
			return
		}
		w.Write(append([]byte("echo "), b...))
	}))
	defer backend.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c, strings.TrimPrefix(backend.URL, "http://"))
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	for i, path := range []string{"/small", "/stream", "/small", "/stream"} {
		req, _ := http.NewRequest("POST", "http://x"+path, strings.NewReader(fmt.Sprint("body", i)))
		if err := req.Write(c); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("request %d: body: %v", i, err)
		}
		want := fmt.Sprintf("echo body%d", i)
		if path == "/stream" {
			want = fmt.Sprintf("data: body%d 0\n\ndata: body%d 1\n\ndata: body%d 2\n\n", i, i, i)
		}
		if string(got) != want {
			t.Fatalf("request %d: got %q, want %q", i, got, want)
		}
	}
}
