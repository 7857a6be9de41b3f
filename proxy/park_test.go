package proxy_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/proxy/listen"
)

// The tests in this file check kept client connections parked on the
// event loops (SLUICE_KEEP_ON_LOOP, proxy.SetParkKept): after a loop
// stream the socket waits for its next request on the loop, with no
// goroutine, and the own HTTP/1.1 server serves that request on a
// goroutine started when its bytes arrive.

// parkEdge is loopEdge with the own HTTP/1.1 server and parking on.
func parkEdge(t *testing.T, backend string, server func(*listen.Server)) *testEdge {
	t.Helper()
	proxy.SetParkKept(true)
	t.Cleanup(func() { proxy.SetParkKept(false) })
	return loopEdge(t, backend, edgeOpts{server: func(s *listen.Server) {
		s.HTTPServer = listen.HTTPServerSluice
		if server != nil {
			server(s)
		}
	}})
}

func parked(t *testing.T, e *testEdge, n int64) {
	t.Helper()
	waitFor(t, 5*time.Second, strconv.FormatInt(n, 10)+" connections parked on the loops", func() bool { return e.handler.LoopParked() == n })
}

// rawStream runs one loop stream on conn (its request written first when
// write is set) and reads it to its end.
func rawStream(t *testing.T, conn net.Conn, br *bufio.Reader, e *testEdge, b *stepBackend, write bool) {
	t.Helper()
	if write {
		io.WriteString(conn, chatRequest())
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Close {
		t.Fatalf("status %d, close %v", resp.StatusCode, resp.Close)
	}
	ev := newEventReader(resp.Body)
	if got, err := ev.next(); err != nil || got != tokenEvent(0) {
		t.Fatalf("first token: %q %v", got, err)
	}
	onLoop(t, e, 1)
	b.next <- struct{}{}
	rest, err := io.ReadAll(resp.Body)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("rest %q %v", rest, err)
	}
}

func chatRequest() string {
	body := chatBody("")
	return "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + testKey +
		"\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

func dialEdge(t *testing.T, e *testEdge) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.http, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	return conn, bufio.NewReader(conn)
}

// TestLoopParkedKeepAlive: three streams on one client connection; between
// them it is parked on the loop; the client's close closes it there.
func TestLoopParkedKeepAlive(t *testing.T) {
	b := newStepBackend(t, 2)
	e := parkEdge(t, b.url, nil)
	var dials atomic.Int64
	c := countingClient(&dials, "", nil)
	for i := range 3 {
		if resp := loopStreamOnce(t, c, e, b); resp.Close {
			t.Fatalf("stream %d: Connection: close", i)
		}
		parked(t, e, 1)
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d connections for 3 streams, want 1", n)
	}
	// A small request on the parked connection is served too.
	resp, err := c.Get(e.http + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != 200 || dials.Load() != 1 {
		t.Fatalf("after parking: status %d, %d dials", resp.StatusCode, dials.Load())
	}
	loopStreamOnce(t, c, e, b)
	parked(t, e, 1)
	c.CloseIdleConnections()
	parked(t, e, 0)
}

// TestLoopParkedPipelined: a request that came during the stream, or with
// the first, is served at once (not parked: no edge would come for it);
// the connection is parked after the last.
func TestLoopParkedPipelined(t *testing.T) {
	for _, together := range []bool{true, false} {
		t.Run(strconv.FormatBool(together), func(t *testing.T) {
			b := newStepBackend(t, 2)
			e := parkEdge(t, b.url, nil)
			conn, br := dialEdge(t, e)
			first := chatRequest()
			if together {
				first += chatRequest()
			}
			io.WriteString(conn, first)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			ev := newEventReader(resp.Body)
			ev.next()
			onLoop(t, e, 1)
			if !together {
				io.WriteString(conn, chatRequest())
				time.Sleep(50 * time.Millisecond)
			}
			b.next <- struct{}{}
			io.ReadAll(resp.Body)
			rawStream(t, conn, br, e, b, false) // the second, from the socket
			parked(t, e, 1)
			rawStream(t, conn, br, e, b, true) // and a third after parking
			parked(t, e, 1)
		})
	}
}

// TestLoopParkedIdleTimeout: a parked connection is closed by the loop's
// sweep after the server's idle timeout, its count released.
func TestLoopParkedIdleTimeout(t *testing.T) {
	b := newStepBackend(t, 2)
	e := parkEdge(t, b.url, func(s *listen.Server) { s.IdleTimeout = 300 * time.Millisecond; s.MaxConnsPerAddr = 1 })
	conn, br := dialEdge(t, e)
	rawStream(t, conn, br, e, b, true)
	parked(t, e, 1)
	// While parked it counts against the cap: a second connection is
	// refused.
	if got := rawRequest(t, e.http); got != "" {
		t.Fatalf("a second connection was served while the parked one is open (cap 1): %q", got)
	}
	start := time.Now()
	if _, err := br.ReadByte(); err == nil || isTimeout(err) {
		t.Fatalf("the parked connection was not closed: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("closed after %v, idle timeout 300ms", d)
	}
	parked(t, e, 0)
	waitFor(t, 5*time.Second, "a connection served once the parked one closed", func() bool {
		return strings.HasPrefix(rawRequest(t, e.http), "HTTP/1.1 ")
	})
}

// TestLoopParkedDrain: Shutdown closes parked connections at once.
func TestLoopParkedDrain(t *testing.T) {
	b := newStepBackend(t, 2)
	e := parkEdge(t, b.url, nil)
	conn, br := dialEdge(t, e)
	rawStream(t, conn, br, e, b, true)
	parked(t, e, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	if err := e.server.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Shutdown took %v with a parked connection", d)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := br.ReadByte(); err == nil || isTimeout(err) {
		t.Fatalf("the parked connection is open after Shutdown: %d %v", n, err)
	}
	parked(t, e, 0)
}

// TestLoopParkedNoGoroutine: twenty parked connections hold no goroutine
// each (the re-admitted ones each had one waiting for its next request).
func TestLoopParkedNoGoroutine(t *testing.T) {
	b := newStepBackend(t, 2)
	e := parkEdge(t, b.url, nil)
	conn, br := dialEdge(t, e)
	rawStream(t, conn, br, e, b, true) // the loops and pools start
	parked(t, e, 1)
	time.Sleep(100 * time.Millisecond)
	before := runtime.NumGoroutine()
	const n = 20
	for range n {
		c, r := dialEdge(t, e)
		rawStream(t, c, r, e, b, true)
	}
	parked(t, e, n+1)
	time.Sleep(100 * time.Millisecond)
	if d := runtime.NumGoroutine() - before; d >= n/2 {
		t.Fatalf("%d more goroutines with %d more parked connections", d, n)
	}
	// And each is served again.
	rawStream(t, conn, br, e, b, true)
	parked(t, e, n+1)
}
