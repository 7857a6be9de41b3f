package proxy_test

import (
	"bufio"
	"io"
	"net"
	"net/textproto"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestHTTP10Stream: an HTTP/1.0 client (with Connection: keep-alive,
// which a 1.0 client may send) gets a stream without chunked coding, which
// HTTP/1.0 does not have: the body is the events as they are, ended by the
// connection's close, which the head says (Connection: close, as nginx
// says it; net/http, on the goroutine path, sends no Connection header to
// a 1.0 client, which means the same), and no trailer is announced. On the event loop
// and on the goroutine path alike.
func TestHTTP10Stream(t *testing.T) {
	for _, noLoop := range []bool{false, true} {
		t.Run(map[bool]string{false: "loop", true: "goroutine"}[noLoop], func(t *testing.T) {
			b := newStepBackend(t, 3)
			e := loopEdge(t, b.url, edgeOpts{noLoop: noLoop})
			c, err := net.Dial("tcp", strings.TrimPrefix(e.http, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			body := chatBody("")
			io.WriteString(c, "POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nTE: trailers\r\n"+
				"Authorization: Bearer "+testKey+"\r\nContent-Type: application/json\r\nContent-Length: "+
				strconv.Itoa(len(body))+"\r\n\r\n"+body)
			br := bufio.NewReader(c)
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			// The head as sent (http.ReadResponse drops Connection: close).
			tp := textproto.NewReader(br)
			status, err := tp.ReadLine()
			if err != nil {
				t.Fatal(err)
			}
			hdr, err := tp.ReadMIMEHeader()
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(status, "HTTP/1.") || !strings.Contains(status, " 200 ") {
				t.Fatalf("status line %q", status)
			}
			if te := hdr.Get("Transfer-Encoding"); te != "" {
				t.Fatalf("Transfer-Encoding %q to an HTTP/1.0 client", te)
			}
			if hdr.Get("Content-Length") != "" {
				t.Fatalf("Content-Length %q on a stream", hdr.Get("Content-Length"))
			}
			// net/http (the goroutine path) sends no Connection header to a
			// 1.0 client, which means close for it; the loop says it.
			if conn := hdr.Get("Connection"); conn != "close" && (!noLoop || conn != "") {
				t.Fatalf("Connection %q; want close", conn)
			}
			if hdr.Get("Trailer") != "" {
				t.Fatalf("Trailer %q announced to an HTTP/1.0 client", hdr.Get("Trailer"))
			}
			if !noLoop {
				onLoop(t, e, 1)
			}
			go func() {
				for range 2 {
					b.next <- struct{}{}
				}
			}()
			raw, err := io.ReadAll(br)
			if err != nil {
				t.Fatalf("body: %v", err)
			}
			want := tokenEvent(0) + tokenEvent(1) + tokenEvent(2)
			if got := string(raw); !strings.HasPrefix(got, want) || !strings.HasSuffix(got, "data: [DONE]\n\n") {
				t.Fatalf("body %q; want the events as they are, through [DONE]", got)
			}
		})
	}
}
