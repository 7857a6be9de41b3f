package h1up

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// The connection's raw socket (proxy/internal/rawsock): a request body
// larger than the socket buffers goes out in partial writes to a backend
// that reads it slowly, a large response comes back in order, the
// connection is reused, and a dialled conn without a socket of its own
// (a wrapper) is read and written through its net.Conn.

// slowEcho answers each request with its body, read in small slow steps.
func slowEcho(t *testing.T) *rawServer {
	return newRawServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			var body bytes.Buffer
			buf := make([]byte, 8<<10)
			for i := 0; ; i++ {
				n, err := req.Body.Read(buf)
				body.Write(buf[:n])
				if err != nil {
					break
				}
				if i%32 == 0 {
					time.Sleep(time.Millisecond)
				}
			}
			head := "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(body.Len()) + "\r\n\r\n"
			if _, err := c.Write(append([]byte(head), body.Bytes()...)); err != nil {
				return
			}
		}
	})
}

func patterned(n, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*13 + i>>10 + seed)
	}
	return b
}

func roundTripRaw(t *testing.T, tr *Transport, url string, n int) {
	t.Helper()
	for i := range 3 {
		want := patterned(n, i)
		got := postBody(t, tr, url, want)
		if got != string(want) {
			t.Fatalf("request %d: %d bytes back, not the %d sent in order", i, len(got), len(want))
		}
	}
}

func idleConn(tr *Transport) *conn {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, s := range tr.idle {
		if len(s) > 0 {
			return s[len(s)-1]
		}
	}
	return nil
}

func TestRawSocketLargeBodiesBothWays(t *testing.T) {
	s := slowEcho(t)
	tr := New(Options{})
	defer tr.CloseIdleConnections()
	roundTripRaw(t, tr, s.url(), 3<<20)
	if got := s.accepts.Load(); got != 1 {
		t.Fatalf("%d connections for 3 requests; want 1 (reused)", got)
	}
	c := idleConn(tr)
	if c == nil {
		t.Fatal("no idle connection")
	}
	if (c.rs != nil) != (runtime.GOOS == "linux") {
		t.Fatalf("raw socket %v on %s", c.rs, runtime.GOOS)
	}
}

// wrapped is a dialled connection that hides its socket.
type wrapped struct{ net.Conn }

func TestRawSocketFallbackForWrappedConn(t *testing.T) {
	s := slowEcho(t)
	var d net.Dialer
	tr := New(Options{Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return wrapped{c}, nil
	}})
	defer tr.CloseIdleConnections()
	roundTripRaw(t, tr, s.url(), 1<<20)
	if c := idleConn(tr); c == nil || c.rs != nil {
		t.Fatalf("idle conn %v: want one without a raw socket", c)
	}
}

// TestRawSocketBackendResetsMidResponse: a backend that resets the
// connection in the middle of a response makes the body's read fail, not
// hang.
func TestRawSocketBackendResetsMidResponse(t *testing.T) {
	s := newRawServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", 10<<20)
		c.Write(make([]byte, 64<<10))
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	})
	tr := New(Options{})
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url(), nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err == nil || n >= 10<<20 {
		t.Fatalf("read %d bytes, %v; want an error before the end", n, err)
	}
	if ctx.Err() != nil {
		t.Fatal("the read ended by the test's deadline, not by the reset")
	}
}
