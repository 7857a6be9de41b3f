package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/proxy"
)

// partialBody starts a POST over c whose body declares declared bytes and
// sends only first; it returns the pipe's writer (close it to end the
// request) and a channel with the response status (0 on a transport error).
func partialBody(t *testing.T, c *http.Client, url string, declared int64, first string) (*io.PipeWriter, <-chan int) {
	t.Helper()
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, url, pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = declared
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/json")
	status := make(chan int, 1)
	go func() {
		resp, err := c.Do(req)
		if err != nil {
			status <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		status <- resp.StatusCode
	}()
	go pw.Write([]byte(first)) // returns once the transport read it, or on close
	return pw, status
}

// TestAttackBodyPreallocation: a tenant opens many requests, each
// declaring a 1MiB body and sending one byte. The old readBody grew its
// buffer to the declared length before a byte arrived (250 h2 streams:
// 262MB); now the buffer grows as bytes arrive. Raw HTTP/1.1 connections
// keep the client's own allocations out of the figure (Go's h2 transport
// takes a scratch buffer of up to 512KiB per request body). Fails on the
// old code: 64 requests allocated over 64MiB there.
func TestAttackBodyPreallocation(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(simURL), proxy: proxy.Config{MaxBodyBytes: 1 << 20, TenantBodiesInFlight: 100}})
	addr := strings.TrimPrefix(e.http, "http://")
	const conns = 64
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 0; i < conns; i++ {
		conn, _ := rawConn(t, addr)
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 1048576\r\n\r\n{", testKey)
	}
	// Wait until every handler is reading its body, then measure what the
	// node allocated for them.
	waitFor(t, 5*time.Second, "bodies in flight", func() bool { return e.handler.BodyMemory() >= conns*4<<10 })
	time.Sleep(100 * time.Millisecond)
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	grew := int64(after.TotalAlloc - before.TotalAlloc)
	t.Logf("%d requests declaring 1MiB, 1 byte sent: %d KiB allocated, body memory %d KiB", conns, grew>>10, e.handler.BodyMemory()>>10)
	if grew > 16<<20 {
		t.Errorf("%d unfinished 1MiB bodies allocated %d MiB; want under 16MiB (buffers grow as bytes arrive)", conns, grew>>20)
	}
	if m := e.handler.BodyMemory(); m > conns*8<<10 {
		t.Errorf("body memory %d for %d one-byte bodies", m, conns)
	}
}

// rawConn dials addr for hand-written HTTP/1.1.
func rawConn(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, bufio.NewReader(conn)
}

func readStatus(t *testing.T, conn net.Conn, br *bufio.Reader, within time.Duration) (int, string) {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(within))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, err.Error()
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}

// TestAttackSlowBody: a client declares a body and trickles it one byte at
// a time (slowloris on the body). With no body timeout the old code waited
// forever; now the body must arrive within body_read_timeout at
// body_min_rate after a grace period, else 408.
func TestAttackSlowBody(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(simURL), proxy: proxy.Config{BodyReadTimeout: time.Second}})
	addr := strings.TrimPrefix(e.http, "http://")
	conn, br := rawConn(t, addr)
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n", testKey)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // one byte every 100ms: 10 B/s
		defer wg.Done()
		for i := 0; i < 100; i++ {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := conn.Write([]byte(" ")); err != nil {
				return
			}
		}
	}()
	start := time.Now()
	st, body := readStatus(t, conn, br, 5*time.Second)
	close(stop)
	wg.Wait()
	if st != http.StatusRequestTimeout || !strings.Contains(body, "body_timeout") {
		t.Fatalf("trickled body: status %d %q after %v; want 408 body_timeout", st, body, time.Since(start))
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("408 came after %v; body_read_timeout is 1s", d)
	}
}

// TestAttackSlowBodyMinRate: within the overall timeout, a body slower than
// body_min_rate is cut once the grace period is over.
func TestAttackSlowBodyMinRate(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the 5s grace period")
	}
	_, simURL := startSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(simURL), proxy: proxy.Config{BodyReadTimeout: time.Minute, BodyMinRate: 1 << 10}})
	pw, st := partialBody(t, h2Client(), e.https+"/v1/chat/completions", 1<<20, "{")
	defer pw.Close()
	go func() {
		for i := 0; i < 100; i++ { // 10 B/s, far under 1KiB/s
			time.Sleep(100 * time.Millisecond)
			if _, err := pw.Write([]byte(" ")); err != nil {
				return
			}
		}
	}()
	select {
	case s := <-st:
		if s != http.StatusRequestTimeout {
			t.Fatalf("status %d; want 408", s)
		}
	case <-time.After(9 * time.Second):
		t.Fatal("a 10 B/s body was still being read after 9s (min rate 1KiB/s after 5s)")
	}
}

// TestAttackBodyBudget: many unfinished bodies exhaust the node's body
// memory; the next body gets 503 instead of growing the process, and the
// memory is given back when the bodies end.
func TestAttackBodyBudget(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(simURL), proxy: proxy.Config{BodyMemoryBytes: 100 << 10, TenantBodiesInFlight: 100}})
	c := h2Client()
	defer c.CloseIdleConnections()
	// Two bodies of 40KiB so far each: 2 x 64KiB buffers would pass 100KiB.
	chunk := "{" + strings.Repeat(" ", 40<<10)
	pw1, st1 := partialBody(t, c, e.https+"/v1/chat/completions", 1<<20, chunk)
	defer pw1.Close()
	waitFor(t, 5*time.Second, "first body buffered", func() bool { return e.handler.BodyMemory() >= 40<<10 })
	pw2, st2 := partialBody(t, c, e.https+"/v1/chat/completions", 1<<20, chunk)
	defer pw2.Close()
	select {
	case s := <-st2:
		if s != http.StatusServiceUnavailable {
			t.Fatalf("second body past the budget: status %d; want 503", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("second body past the node's body budget was not refused")
	}
	pw1.CloseWithError(io.ErrUnexpectedEOF)
	<-st1
	waitFor(t, 5*time.Second, "body memory released", func() bool { return e.handler.BodyMemory() == 0 })
	resp := post(t, c, e.https+"/v1/chat/completions", `{"model":"sim-small","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("after the budget was freed: status %d", resp.StatusCode)
	}
}

// TestAttackTenantBodiesInFlight: one tenant holding many unfinished
// bodies gets 429 past tenant_bodies_in_flight, so it cannot take the whole
// node's body budget from the others.
func TestAttackTenantBodiesInFlight(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(simURL), proxy: proxy.Config{TenantBodiesInFlight: 3}})
	c := h2Client()
	defer c.CloseIdleConnections()
	var sts []<-chan int
	for i := 0; i < 3; i++ {
		pw, st := partialBody(t, c, e.https+"/v1/chat/completions", 100, "{")
		defer pw.CloseWithError(io.ErrUnexpectedEOF)
		sts = append(sts, st)
	}
	waitFor(t, 5*time.Second, "3 bodies in flight", func() bool { return e.handler.BodyMemory() >= 3*101 })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp := postCtx(t, ctx, c, e.https+"/v1/chat/completions", `{"model":"sim-small","max_tokens":2,"messages":[]}`)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(b), "too_many_bodies") {
		t.Fatalf("4th body while 3 are in flight: %d %s; want 429 too_many_bodies", resp.StatusCode, b)
	}
	for _, st := range sts {
		select {
		case <-st:
			t.Fatal("an in-flight body ended early")
		default:
		}
	}
}
