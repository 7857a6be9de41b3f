package proxy_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/proxy/listen"
)

// The tests in this file check that a client's HTTP/1.1 connection lives
// on after a stream the event loops relayed (handoff.go, Keep; listen's
// Readmit): the server serves the next request on it.

// countingClient is an HTTP/1.1 client that counts the connections it
// dials (from local, "" for any; hdr is written first when not nil).
func countingClient(dials *atomic.Int64, local string, hdr []byte) *http.Client {
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			d := net.Dialer{}
			if local != "" {
				d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
			}
			c, err := d.DialContext(ctx, network, addr)
			if err == nil && hdr != nil {
				_, err = c.Write(hdr)
			}
			return c, err
		},
	}}
}

// loopStreamOnce posts a streamed request with c, checks that it went to
// the event loop (one token, then the loop holds it until the backend's
// next) and that it ends with [DONE]; it returns the response (body read).
func loopStreamOnce(t *testing.T, c *http.Client, e *testEdge, b *stepBackend) *http.Response {
	t.Helper()
	return loopStream(t, c, e, b.next)
}

// TestLoopKeepAlive: a keep-alive client's streams on the event loops
// share one connection: the responses do not say Connection: close and
// the client dials once for three streams.
func TestLoopKeepAlive(t *testing.T) {
	b := newStepBackend(t, 2)
	e := loopEdge(t, b.url, edgeOpts{})
	var dials atomic.Int64
	c := countingClient(&dials, "", nil)
	for i := range 3 {
		resp := loopStreamOnce(t, c, e, b)
		if resp.Close {
			t.Fatalf("stream %d: the response says Connection: close", i)
		}
		// The connection goes back to the client's pool when the body
		// ends; the server takes it back a moment later (after the last
		// bytes): the next request may be written before, it waits in
		// the socket.
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d connections dialed for 3 streams on a keep-alive client, want 1", n)
	}

	// A client that asks for Connection: close gets it, and a new
	// connection each time.
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, e.http+"/v1/chat/completions", strings.NewReader(chatBody("")))
		req.Header.Set("Authorization", "Bearer "+testKey)
		req.Close = true
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		ev := newEventReader(resp.Body)
		ev.next()
		onLoop(t, e, 1)
		b.next <- struct{}{}
		io.ReadAll(resp.Body)
		resp.Body.Close()
		if !resp.Close {
			t.Fatal("a Connection: close request's stream did not answer Connection: close")
		}
	}
	// The first went on the kept connection, which then closed.
	if n := dials.Load(); n != 2 {
		t.Fatalf("%d dials after two Connection: close requests, want 2", n)
	}
}

// TestLoopKeepAlivePipelined: a request the client sent on the connection
// while a loop stream ran (or together with the first) is answered after
// the stream, on the same connection: nothing is lost.
func TestLoopKeepAlivePipelined(t *testing.T) {
	for _, together := range []bool{true, false} {
		name := "during"
		if together {
			name = "together"
		}
		t.Run(name, func(t *testing.T) {
			b := newStepBackend(t, 2)
			e := loopEdge(t, b.url, edgeOpts{})
			conn, err := net.Dial("tcp", strings.TrimPrefix(e.http, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(20 * time.Second))
			body := chatBody("")
			req := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + testKey +
				"\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
			first := req
			if together {
				first += req
			}
			if _, err := io.WriteString(conn, first); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(conn)
			for i := range 2 {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("response %d: %v", i, err)
				}
				if resp.StatusCode != 200 || resp.Close {
					t.Fatalf("response %d: status %d, close %v", i, resp.StatusCode, resp.Close)
				}
				ev := newEventReader(resp.Body)
				if got, err := ev.next(); err != nil || got != tokenEvent(0) {
					t.Fatalf("response %d, first token: %q %v", i, got, err)
				}
				onLoop(t, e, 1)
				if i == 0 && !together {
					// The next request arrives while the stream is on
					// the loop.
					if _, err := io.WriteString(conn, req); err != nil {
						t.Fatal(err)
					}
					time.Sleep(50 * time.Millisecond)
				}
				b.next <- struct{}{}
				rest, err := io.ReadAll(resp.Body)
				if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
					t.Fatalf("response %d: rest %q %v", i, rest, err)
				}
			}
			onLoop(t, e, 0) // (not between: the next may be on the loop already)
		})
	}
}

// TestLoopKeepAliveConnCap: a connection kept alive across loop streams
// counts once against its address's cap (MaxConnsPerAddr 1): while it is
// open a second connection is refused, and after it closed one is served
// (the count went back to 0, not below, not above).
func TestLoopKeepAliveConnCap(t *testing.T) {
	b := newStepBackend(t, 2)
	b.cancelled = make(chan struct{}, 16) // rawRequest's /v1/models reach the backend and are cancelled
	e := loopEdge(t, b.url, edgeOpts{server: func(s *listen.Server) { s.MaxConnsPerAddr = 1 }})
	var dials atomic.Int64
	c := countingClient(&dials, "", nil)
	for range 4 {
		loopStreamOnce(t, c, e, b)
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d dials for 4 streams, want 1", n)
	}
	time.Sleep(50 * time.Millisecond) // the kept connection is back in the server
	if got := rawRequest(t, e.http); got != "" {
		t.Fatalf("a second connection was served while the kept one is open (cap 1): %q", got)
	}
	c.CloseIdleConnections()
	waitFor(t, 5*time.Second, "a connection accepted once the kept one closed", func() bool {
		return strings.HasPrefix(rawRequest(t, e.http), "HTTP/1.1 ")
	})
	// And only one: the count is exact, not below zero either. (A
	// Connection: close answer's server side closes up to 500ms after
	// the client saw its end: wait for the place.)
	var conn net.Conn
	waitFor(t, 5*time.Second, "a kept-alive plain connection served", func() bool {
		cn, err := net.Dial("tcp", strings.TrimPrefix(e.http, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(cn, "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+testKey+"\r\n\r\n")
		cn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if resp, err := http.ReadResponse(bufio.NewReader(cn), nil); err != nil || resp.StatusCode != 200 {
			cn.Close()
			return false
		}
		conn = cn
		return true
	})
	defer conn.Close()
	if got := rawRequest(t, e.http); got != "" {
		t.Fatalf("a second connection was served while one is open (cap 1): %q", got)
	}
}

// TestLoopKeepAliveDrain: Shutdown closes a connection kept alive after a
// loop stream (idle, waiting for its next request) at once, and returns
// without waiting for it.
func TestLoopKeepAliveDrain(t *testing.T) {
	b := newStepBackend(t, 2)
	e := loopEdge(t, b.url, edgeOpts{})
	var dials atomic.Int64
	var conn net.Conn
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		cn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		conn = cn
		return cn, err
	}}}
	loopStreamOnce(t, c, e, b)
	loopStreamOnce(t, c, e, b) // the second request came on the re-admitted connection
	if dials.Load() != 1 {
		t.Fatalf("%d dials", dials.Load())
	}
	time.Sleep(50 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	if err := e.server.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	// net/http waits up to 5s for a connection that has not sent a
	// request; a kept-alive one is idle and closes at once.
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Shutdown took %v with an idle kept-alive connection", d)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := conn.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("the kept connection is still open after Shutdown: %d %v", n, err)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// TestLoopKeepAliveProxyProtocol: through a PROXY listener, the requests
// after a loop stream on the kept connection still carry the client the
// PROXY header named (access log).
func TestLoopKeepAliveProxyProtocol(t *testing.T) {
	b := newStepBackend(t, 2)
	e := loopEdge(t, b.url, edgeOpts{server: func(s *listen.Server) {
		s.HTTPProxyProtocol = listen.ProxyProtocol{Enabled: true, AllowedCIDRs: []string{"127.0.0.2/32"}}
	}})
	src := netip.AddrPortFrom(netip.MustParseAddr("203.0.113.7"), 50000)
	var dials atomic.Int64
	c := countingClient(&dials, "127.0.0.2", ppV1(src, netip.MustParseAddrPort("198.51.100.1:80")))
	for i := range 3 {
		resp := loopStreamOnce(t, c, e, b)
		if l := accessLine(t, e, resp.Header.Get("X-Request-Id")); !strings.Contains(l, `"client":"203.0.113.7"`) {
			t.Fatalf("stream %d: access log %s; want client 203.0.113.7", i, l)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d dials for 3 streams, want 1", n)
	}
}
