package listen_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/proxy/listen"
)

// The own HTTP/1.1 server against net/http's, byte for byte: each raw
// request goes to both (a plain http.Server with the listener's header
// limit, and a listen.Server with HTTPServerSluice) and the answers must
// be the same bytes (the Date value aside), with the connection left open
// or closed alike.

// sameHandler answers by the request's path, showing what the server
// parsed (Host, header) and writing the response fields in many shapes.
func sameHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		switch r.URL.Path {
		case "/fields":
			h.Set("X-Zeta", "z")
			h.Set("Cache-Control", "no-store")
			h.Add("X-Alpha", "a1")
			h.Add("X-Alpha", "a2")
			h.Set("Content-Type", "text/plain")
			h.Set("Vary", "Accept")
			h.Set("X-Mid", "  spaced\tvalue \r\n")
			h["bad name"] = []string{"dropped"}
			h["X-Split"] = []string{"a\r\nInjected: yes"}
			h["X-Breaks"] = []string{"a\nb\rc\r\n\r\nd\n", "\r\n lone \n"}
			io.WriteString(w, "hello")
		case "/sniff":
			io.WriteString(w, "<html><body>x</body></html>")
		case "/stream":
			h.Set("Content-Type", "text/event-stream")
			h.Set("X-B", "b")
			h.Set("X-A", "a")
			io.WriteString(w, "data: 1\n\n")
			w.(http.Flusher).Flush()
			io.WriteString(w, "data: 2\n\n")
		case "/trailers":
			h.Set("Trailer", "X-T2, x-t1")
			h.Set("X-Head", "h")
			io.WriteString(w, "body")
			h.Set("X-T1", "one")
			h.Set("X-T2", "two")
			h.Set(http.TrailerPrefix+"X-Late", "late")
		case "/trailers-flushed":
			h.Set("Trailer", "X-T")
			io.WriteString(w, "body")
			w.(http.Flusher).Flush()
			h.Set("X-T", "t")
			h.Set(http.TrailerPrefix+"X-A", "a")
		case "/204":
			h.Set("Content-Length", "10")
			h.Set("X-A", "a")
			w.WriteHeader(http.StatusNoContent)
		case "/304":
			h.Set("Content-Type", "text/plain")
			h.Set("Content-Length", "10")
			h.Set("Etag", `"x"`)
			w.WriteHeader(http.StatusNotModified)
		case "/close":
			h.Set("Connection", "close")
			io.WriteString(w, "bye")
		case "/keepalive-field":
			h.Set("Connection", "keep-alive")
			io.WriteString(w, "k")
		case "/length":
			h.Set("Content-Length", "3")
			io.WriteString(w, "abc")
		case "/length-and-te":
			h.Set("Content-Length", "3")
			h.Set("Transfer-Encoding", "chunked")
			io.WriteString(w, "abc")
		case "/identity":
			h.Set("Transfer-Encoding", "identity")
			io.WriteString(w, "raw")
		case "/big":
			w.Write(bytes.Repeat([]byte("x"), 10<<10))
		case "/status":
			w.WriteHeader(http.StatusTeapot)
			io.WriteString(w, "tea")
		case "/empty":
		case "/hints":
			h.Set("Link", "</a.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			h.Del("Link")
			io.WriteString(w, "after")
		default:
			h.Set("Content-Type", "text/plain")
			fmt.Fprintf(w, "%s %s host=%q x=%q", r.Method, r.URL.Path, r.Host, r.Header["X"])
		}
	})
}

func startPair(t *testing.T) (goAddr, ownAddr string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ref := &http.Server{Handler: sameHandler(), MaxHeaderBytes: listen.MaxHeaderBytes, ReadHeaderTimeout: 10 * time.Second}
	go ref.Serve(ln)
	t.Cleanup(func() { ref.Close() })
	_, ownAddr = startOwn(t, sameHandler(), 0)
	return ln.Addr().String(), ownAddr
}

var dateLine = regexp.MustCompile(`(?m)^Date: [^\r]*\r$`)

// rawExchange sends req on a new connection and returns the bytes that
// came back (read until the last response's end) and whether the server
// closed the connection after them.
func rawExchange(t *testing.T, addr, req string, responses int) (string, bool) {
	method, _, _ := strings.Cut(req, " ")
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	br := bufio.NewReader(io.TeeReader(c, &got))
	for range responses {
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			t.Fatalf("%.50q: %v (read %q)", req, err, got.String())
		}
		if _, err := io.ReadAll(resp.Body); err != nil {
			t.Fatalf("%.50q: body: %v", req, err)
		}
	}
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	_, err = br.ReadByte()
	var ne net.Error
	closed := !(errors.As(err, &ne) && ne.Timeout())
	return dateLine.ReplaceAllString(got.String(), "Date: -\r"), closed
}

func TestH1SameBytesAsNetHTTP(t *testing.T) {
	if os.Getenv(listen.HTTPServerEnv) != "" && os.Getenv(listen.HTTPServerEnv) != listen.HTTPServerSluice {
		t.Skip("the own server is overridden by " + listen.HTTPServerEnv)
	}
	goAddr, ownAddr := startPair(t)
	get := func(path string) string { return "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n" }
	limit := listen.MaxHeaderBytes + 4096
	// headOf returns a GET whose head is exactly n bytes.
	headOf := func(n int) string {
		pre, post := "GET / HTTP/1.1\r\nHost: x\r\nX: ", "\r\n\r\n"
		return pre + strings.Repeat("a", n-len(pre)-len(post)) + post
	}
	for _, tc := range []struct {
		name, req string
		responses int
	}{
		{"sorted fields, values cleaned, bad names dropped", get("/fields"), 1},
		{"sniffed type", get("/sniff"), 1},
		{"streamed", get("/stream"), 1},
		{"trailers after the handler", get("/trailers"), 1},
		{"trailers of a flushed response", get("/trailers-flushed"), 1},
		{"204", get("/204"), 1},
		{"304", get("/304"), 1},
		{"handler's Connection: close", get("/close"), 1},
		{"handler's Connection: keep-alive", get("/keepalive-field"), 1},
		{"declared length", get("/length"), 1},
		{"length and chunked", get("/length-and-te"), 1},
		{"identity", get("/identity"), 1},
		{"past the buffer", get("/big"), 1},
		{"other status", get("/status"), 1},
		{"empty", get("/empty"), 1},
		{"103 then 200", get("/hints"), 2},
		{"HEAD", "HEAD /sniff HTTP/1.1\r\nHost: x\r\n\r\n", 1},
		{"HEAD, empty", "HEAD /empty HTTP/1.1\r\nHost: x\r\n\r\n", 1},
		{"client's close", "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 1},
		{"HTTP/1.0", "GET / HTTP/1.0\r\n\r\n", 1},
		{"HTTP/1.0 keep-alive", "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", 1},
		{"HTTP/1.0 keep-alive, streamed", "GET /stream HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", 1},
		{"HTTP/1.0 HEAD keep-alive", "HEAD /empty HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", 1},
		{"pipelined", get("/a") + get("/fields") + get("/b"), 3},
		// The fast parser's common heads (h1parse.go) and their edges.
		{"lower-case names, repeated field", "GET /q?a=%41 HTTP/1.1\r\nhost: x\r\nx: 1\r\nX:  2 \r\n\r\n", 1},
		{"body of declared length, then the next request", "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc" + get("/b"), 2},
		{"head past the read buffer", "GET / HTTP/1.1\r\nHost: x\r\nX: " + strings.Repeat("v", 5000) + "\r\n\r\n", 1},
		{"bare LF", "GET / HTTP/1.1\nHost: x\nX: lf\n\n", 1},
		{"obs-fold", "GET / HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n", 1},
		{"space before the colon", "GET / HTTP/1.1\r\nHost: x\r\nX : a\r\n\r\n", 1},
		{"two lengths", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx", 1},
		{"signed length", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +1\r\n\r\nx", 1},
		{"Pragma", "GET / HTTP/1.1\r\nHost: x\r\nPragma: no-cache\r\n\r\n", 1},
		{"DEL in a value", "GET / HTTP/1.1\r\nHost: x\r\nX: a\x7fb\r\n\r\n", 1},
		{"bad escape in the target", "GET /%zz HTTP/1.1\r\nHost: x\r\n\r\n", 1},
		// Host (RFC 9112 section 3.2).
		{"empty Host", "GET / HTTP/1.1\r\nHost:\r\n\r\n", 1},
		{"no Host", "GET / HTTP/1.1\r\n\r\n", 1},
		{"absolute form without Host", "GET http://a.example/p HTTP/1.1\r\n\r\n", 1},
		{"absolute form, other Host", "GET http://a.example/p HTTP/1.1\r\nHost: b.example\r\n\r\n", 1},
		{"absolute form, empty Host", "GET http://a.example/p HTTP/1.1\r\nHost: \r\n\r\n", 1},
		{"HTTP/1.0 without Host", "GET /p HTTP/1.0\r\n\r\n", 1},
		{"bad Host", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 1},
		{"two Hosts", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 1},
		{"Expect: 100-continue on HTTP/1.0", "POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx", 1},
		{"other Expect", "GET / HTTP/1.1\r\nHost: x\r\nExpect: magic\r\n\r\n", 1},
		{"other Expect on HTTP/1.0", "GET / HTTP/1.0\r\nExpect: magic\r\n\r\n", 1},
		{"unsupported coding", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 1},
		{"HTTP/3.0", "GET / HTTP/3.0\r\nHost: x\r\n\r\n", 1},
		{"bad field value", "GET / HTTP/1.1\r\nHost: x\r\nX: a\x01b\r\n\r\n", 1},
		{"malformed", "GET\r\n\r\n", 1},
		{"CONNECT without Host", "CONNECT a.example:443 HTTP/1.1\r\n\r\n", 1},
		// The head's size limit: net/http's counts the bytes read from
		// the socket for the head, up to MaxHeaderBytes + 4096.
		{"head at the limit", headOf(limit), 1},
		{"head past the limit", headOf(limit + 1), 1},
		{"head well past the limit", headOf(limit + 5000), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			want, wantClosed := rawExchange(t, goAddr, tc.req, tc.responses)
			got, gotClosed := rawExchange(t, ownAddr, tc.req, tc.responses)
			if got != want || gotClosed != wantClosed {
				t.Fatalf("own server:\n%q closed=%v\nnet/http:\n%q closed=%v", got, gotClosed, want, wantClosed)
			}
		})
	}
}
