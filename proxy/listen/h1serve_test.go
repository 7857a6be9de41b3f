package listen_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/proxy/listen"
)

// The rules of Sluice's own HTTP/1.1 server (HTTPServerSluice) that the
// tests of the proxy package (run with SLUICE_HTTP_SERVER=sluice) do not
// cover, each against a real listener and raw or real clients.

func startOwn(t *testing.T, h http.Handler, idle time.Duration) (*listen.Server, string) {
	t.Helper()
	s := &listen.Server{Handler: h, HTTPAddr: "127.0.0.1:0", HTTPServer: listen.HTTPServerSluice, IdleTimeout: idle}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	go s.Serve()
	t.Cleanup(func() { s.Close() })
	return s, s.Addr(listen.ListenerHTTP)
}

func echo() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.Path, b)
	})
}

func dialRaw(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c, bufio.NewReader(c)
}

func readResp(t *testing.T, br *bufio.Reader, method string) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// TestH1PipelinedRequestsAnsweredInOrder: three requests in one write (the
// second with a chunked body) get three answers in order on one
// connection, each with its length.
func TestH1PipelinedRequestsAnsweredInOrder(t *testing.T) {
	_, addr := startOwn(t, echo(), 0)
	c, br := dialRaw(t, addr)
	io.WriteString(c, "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"+
		"POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nde\r\n1\r\nf\r\n0\r\n\r\n"+
		"GET /c HTTP/1.1\r\nHost: x\r\n\r\n")
	for _, want := range []string{"POST /a abc", "POST /b def", "GET /c "} {
		resp, body := readResp(t, br, "GET")
		if body != want || resp.ContentLength != int64(len(want)) || resp.Close {
			t.Fatalf("got %q (length %d, close %v); want %q kept", body, resp.ContentLength, resp.Close, want)
		}
	}
}

// TestH1BadRequestsClose: each malformed request gets its status with
// Connection: close, and the connection ends.
func TestH1BadRequestsClose(t *testing.T) {
	_, addr := startOwn(t, echo(), 0)
	for _, tc := range []struct {
		req    string
		status int
	}{
		{"GET / HTTP/1.1\r\n\r\n", 400},                           // no Host
		{"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400},              // bad Host
		{"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400},     // two Hosts
		{"GET / HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n", 400}, // bad field name
		{"GET / HTTP/1.1\r\nHost: x\r\nX: a\x01b\r\n\r\n", 400},   // bad field value
		{"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400},
		{"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
		{"GET / HTTP/1.1\r\nHost: x\r\nExpect: magic\r\n\r\n", 417},
		{"GET / HTTP/3.0\r\nHost: x\r\n\r\n", 505},
		{"GET / HTTP/1.1\r\nHost: x\r\nX: " + strings.Repeat("a", 80<<10) + "\r\n\r\n", 431},
	} {
		c, br := dialRaw(t, addr)
		io.WriteString(c, tc.req)
		resp, _ := readResp(t, br, "GET")
		if resp.StatusCode != tc.status || !resp.Close {
			t.Fatalf("%.40q: got %d close=%v; want %d with Connection: close", tc.req, resp.StatusCode, resp.Close, tc.status)
		}
		if _, err := br.ReadByte(); err == nil {
			t.Fatalf("%.40q: the connection stayed open", tc.req)
		}
	}
}

// TestH1ExpectContinue: the client waits for 100 Continue before sending
// the body; the server sends it when the handler reads, and only then.
func TestH1ExpectContinue(t *testing.T) {
	_, addr := startOwn(t, echo(), 0)
	c, br := dialRaw(t, addr)
	io.WriteString(c, "POST /e HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
	line, err := br.ReadString('\n')
	if err != nil || line != "HTTP/1.1 100 Continue\r\n" {
		t.Fatalf("got %q, %v; want 100 Continue", line, err)
	}
	if blank, _ := br.ReadString('\n'); blank != "\r\n" {
		t.Fatalf("got %q after the 100", blank)
	}
	io.WriteString(c, "hello")
	if _, body := readResp(t, br, "POST"); body != "POST /e hello" {
		t.Fatalf("got %q", body)
	}
	// A handler that answers without reading: no 100, and the connection
	// closes after the answer (the body may still come).
	_, addr = startOwn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "no") }), 0)
	c, br = dialRaw(t, addr)
	io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
	resp, body := readResp(t, br, "POST")
	if resp.StatusCode != 200 || body != "no" || !resp.Close {
		t.Fatalf("got %d %q close=%v; want 200 no, closed", resp.StatusCode, body, resp.Close)
	}
}

// TestH1UnreadBodyDrained: a small body the handler ignored is read past
// (the next request on the connection is served); one past the bound
// closes the connection after the answer.
func TestH1UnreadBodyDrained(t *testing.T) {
	_, addr := startOwn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.URL.Path) }), 0)
	c, br := dialRaw(t, addr)
	small := strings.Repeat("x", 10<<10)
	fmt.Fprintf(c, "POST /1 HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%sGET /2 HTTP/1.1\r\nHost: x\r\n\r\n", len(small), small)
	for _, want := range []string{"/1", "/2"} {
		if resp, body := readResp(t, br, "GET"); body != want || resp.Close {
			t.Fatalf("got %q close=%v; want %q kept", body, resp.Close, want)
		}
	}
	c, br = dialRaw(t, addr)
	big := 300 << 10
	fmt.Fprintf(c, "POST /3 HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", big)
	go c.Write(make([]byte, big))
	if resp, body := readResp(t, br, "GET"); body != "/3" || !resp.Close {
		t.Fatalf("got %q close=%v; want /3 and Connection: close", body, resp.Close)
	}
}

// TestH1HTTP10: HTTP/1.0 closes after the answer unless the client asks
// for keep-alive (then the answer says keep-alive and has a length); a
// streamed answer is delimited by the close.
func TestH1HTTP10(t *testing.T) {
	_, addr := startOwn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "part")
		if r.URL.Path == "/stream" {
			w.(http.Flusher).Flush()
			io.WriteString(w, "two")
		}
	}), 0)
	c, br := dialRaw(t, addr)
	io.WriteString(c, "GET / HTTP/1.0\r\n\r\n")
	resp, body := readResp(t, br, "GET")
	if resp.Proto != "HTTP/1.0" || body != "part" || !resp.Close {
		t.Fatalf("got %s %q close=%v", resp.Proto, body, resp.Close)
	}
	c, br = dialRaw(t, addr)
	io.WriteString(c, "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /stream HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
	resp, body = readResp(t, br, "GET")
	if body != "part" || resp.Close || resp.Header.Get("Connection") != "keep-alive" {
		t.Fatalf("got %q close=%v Connection=%q; want kept", body, resp.Close, resp.Header.Get("Connection"))
	}
	resp, body = readResp(t, br, "GET")
	if body != "parttwo" || !resp.Close || len(resp.TransferEncoding) > 0 {
		t.Fatalf("streamed: got %q close=%v TE=%v; want parttwo delimited by the close", body, resp.Close, resp.TransferEncoding)
	}
}

// TestH1StreamAndTrailers: flushed writes arrive one by one, chunked, and
// the trailers (declared and TrailerPrefix) follow the last chunk.
func TestH1StreamAndTrailers(t *testing.T) {
	next := make(chan struct{})
	_, addr := startOwn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Declared")
		io.WriteString(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		<-next
		io.WriteString(w, "data: [DONE]\n\n")
		w.Header().Set("X-Declared", "d")
		w.Header().Set(http.TrailerPrefix+"X-Late", "l")
	}), 0)
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
		t.Fatalf("Transfer-Encoding %v; want chunked", resp.TransferEncoding)
	}
	first := make([]byte, 9)
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "data: 1\n\n" {
		t.Fatalf("first event %q, %v (before the handler went on)", first, err)
	}
	close(next)
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(rest) != "data: [DONE]\n\n" {
		t.Fatalf("rest %q, %v", rest, err)
	}
	if resp.Trailer.Get("X-Declared") != "d" || resp.Trailer.Get("X-Late") != "l" {
		t.Fatalf("trailers %v", resp.Trailer)
	}
}

// TestH1ClientGoneCancels: a client that leaves while its request's
// handler waits cancels the request's context.
func TestH1ClientGoneCancels(t *testing.T) {
	started, cancelled := make(chan struct{}), make(chan error, 1)
	_, addr := startOwn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		close(started)
		select {
		case <-r.Context().Done():
			cancelled <- context.Cause(r.Context())
		case <-time.After(5 * time.Second):
			cancelled <- nil
		}
	}), 0)
	c, _ := dialRaw(t, addr)
	io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
	<-started
	c.Close()
	if err := <-cancelled; err == nil {
		t.Fatal("the request's context was not cancelled within 5s of the client's close")
	}
}

// TestH1StopCancelsRunning: when the server stops — Shutdown's drain
// deadline passes, or Close — a running request's context and a hijacked
// request's (a WebSocket's, whose handler runs on) end with ErrDraining.
// The requests' contexts do not derive from the server's cancellable base
// (h1Server.connBase): stopRequests and Hijack's watch of the base do it.
func TestH1StopCancelsRunning(t *testing.T) {
	for _, how := range []string{"shutdown", "close"} {
		t.Run(how, func(t *testing.T) {
			causes := make(chan error, 2)
			var started sync.WaitGroup
			started.Add(2)
			s, addr := startOwn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/hijack" {
					c, _, err := http.NewResponseController(w).Hijack()
					if err != nil {
						t.Error(err)
					} else {
						defer c.Close()
					}
				}
				started.Done()
				select {
				case <-r.Context().Done():
					causes <- context.Cause(r.Context())
				case <-time.After(5 * time.Second):
					causes <- nil
				}
			}), 0)
			for _, path := range []string{"/run", "/hijack"} {
				c, _ := dialRaw(t, addr)
				io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
			}
			started.Wait()
			shut := make(chan error, 1)
			if how == "shutdown" {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				defer cancel()
				go func() { shut <- s.Shutdown(ctx) }()
			} else {
				shut <- s.Close()
			}
			for range 2 {
				if err := <-causes; !errors.Is(err, listen.ErrDraining) {
					t.Fatalf("a running request's context ended with %v; want ErrDraining", err)
				}
			}
			select {
			case <-shut:
			case <-time.After(10 * time.Second):
				t.Fatal("the server's stop did not return")
			}
		})
	}
}

// TestH1HeadTimeout: a request's head that does not come whole within the
// header timeout closes its connection — a head stalled part way, a head
// sent a byte at a time (the deadline is set once, not moved by each
// byte) and the second head on a kept connection —, while a request whose
// head came whole reads a body that comes after both the header timeout
// and the idle timeout (no deadline of the server's is left on the socket
// once the head is read, though none is set for a head that came whole).
func TestH1HeadTimeout(t *testing.T) {
	const headTO, idle = 300 * time.Millisecond, 400 * time.Millisecond
	s := &listen.Server{Handler: echo(), HTTPAddr: "127.0.0.1:0", HTTPServer: listen.HTTPServerSluice, IdleTimeout: idle}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	listen.SetH1HeadTimeout(s, headTO)
	go s.Serve()
	t.Cleanup(func() { s.Close() })
	addr := s.Addr(listen.ListenerHTTP)
	closesInTime := func(t *testing.T, c net.Conn, t0 time.Time) {
		t.Helper()
		if !closedWithin(c, 3*time.Second) {
			t.Fatal("the connection outlived its head's timeout by 3s")
		}
		if d := time.Since(t0); d < headTO*2/3 {
			t.Fatalf("closed after %v, before the header timeout", d)
		}
	}
	t.Run("stalled", func(t *testing.T) {
		c, _ := dialRaw(t, addr)
		t0 := time.Now()
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n")
		closesInTime(t, c, t0)
	})
	t.Run("trickle", func(t *testing.T) {
		c, _ := dialRaw(t, addr)
		head := "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + strings.Repeat("a", 200) // 20 ms a byte: 4.6 s
		done := make(chan struct{})
		t0 := time.Now()
		go func() {
			defer close(done)
			for i := range len(head) {
				if _, err := io.WriteString(c, head[i:i+1]); err != nil {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
		closesInTime(t, c, t0)
		c.Close()
		<-done
	})
	t.Run("kept", func(t *testing.T) {
		c, br := dialRaw(t, addr)
		io.WriteString(c, "GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
		readResp(t, br, "GET")
		t0 := time.Now()
		io.WriteString(c, "GET /b HTTP/1.1\r\nHost: x\r\n")
		closesInTime(t, c, t0)
	})
	for _, kept := range []bool{false, true} {
		t.Run(fmt.Sprintf("late body, kept %v", kept), func(t *testing.T) {
			c, br := dialRaw(t, addr)
			if kept {
				io.WriteString(c, "GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
				readResp(t, br, "GET") // the next wait has the idle deadline
			}
			io.WriteString(c, "POST /late HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n")
			time.Sleep(headTO + idle + 200*time.Millisecond)
			io.WriteString(c, "body")
			if _, body := readResp(t, br, "POST"); body != "POST /late body" {
				t.Fatalf("got %q: a deadline of the server's was left on the socket for the body", body)
			}
		})
	}
}

// TestH1BodyWhole: a request body reports Whole (its reader needs no
// socket read: proxy's readBody sets no read deadline then) exactly when
// all of it is in the server's buffer: sent with the head, or absent; not
// when it comes later, nor when it is chunked; and once read to its end.
func TestH1BodyWhole(t *testing.T) {
	type whole interface{ Whole() bool }
	got := make(chan [2]bool, 1)
	_, addr := startOwn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := r.Body.(whole)
		if !ok {
			t.Errorf("the body %T has no Whole", r.Body)
			got <- [2]bool{}
			return
		}
		before := b.Whole()
		io.ReadAll(r.Body)
		got <- [2]bool{before, b.Whole()}
	}), 0)
	for _, tc := range []struct {
		name, head, late string
		want             bool
	}{
		{"with the head", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", "", true},
		{"none", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", "", true},
		{"later", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhe", "llo", false},
		{"chunked", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, br := dialRaw(t, addr)
			io.WriteString(c, tc.head)
			if tc.late != "" {
				time.Sleep(100 * time.Millisecond)
				io.WriteString(c, tc.late)
			}
			g := <-got
			readResp(t, br, "POST")
			if g[0] != tc.want || !g[1] {
				t.Fatalf("Whole before reading %v, after %v; want %v, true", g[0], g[1], tc.want)
			}
		})
	}
}

// TestH1WatchDelayDefault: by default a client's close is noticed once
// its handler has run the watch delay past the body's end, not sooner (a
// small answer within the delay pays no watcher), and not much later.
func TestH1WatchDelayDefault(t *testing.T) {
	if listen.H1WatchDelay < 50*time.Millisecond {
		t.Fatalf("default watch delay %v; small requests waiting on a loaded backend would each start a watcher", listen.H1WatchDelay)
	}
	started, cancelled := make(chan time.Time, 1), make(chan time.Duration, 1)
	_, addr := startOwn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		t0 := time.Now()
		started <- t0
		select {
		case <-r.Context().Done():
			cancelled <- time.Since(t0)
		case <-time.After(5 * time.Second):
			cancelled <- -1
		}
	}), 0)
	c, _ := dialRaw(t, addr)
	io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
	<-started
	c.Close()
	d := <-cancelled
	switch {
	case d < 0:
		t.Fatal("the request's context was not cancelled within 5s of the client's close")
	case d < listen.H1WatchDelay*8/10:
		t.Fatalf("cancelled %v after the body's end; the watcher started before the delay (%v)", d, listen.H1WatchDelay)
	case d > listen.H1WatchDelay+2*time.Second:
		t.Fatalf("cancelled %v after the body's end; want about %v", d, listen.H1WatchDelay)
	}
}

// TestH1H2CPriorKnowledge: a connection opening with the HTTP/2 preface is
// served as h2c, with the connection's facts.
func TestH1H2CPriorKnowledge(t *testing.T) {
	_, addr := startOwn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ci, ok := listen.ConnInfoFrom(r.Context())
		fmt.Fprintf(w, "%s %s %v", r.Proto, ci.Proto, ok)
	}), 0)
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &protos}
	defer tr.CloseIdleConnections()
	for range 2 {
		resp, err := (&http.Client{Transport: tr}).Get("http://" + addr + "/")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "HTTP/2.0 h2 true" {
			t.Fatalf("got %q", b)
		}
	}
}

// TestH1Hijack: the hijacker gets the connection and the bytes the server
// read after the request (a pipelined one) in its reader.
func TestH1Hijack(t *testing.T) {
	_, addr := startOwn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(50 * time.Millisecond) // the next bytes arrive
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		line, _ := brw.ReadString('\n')
		fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(line), line)
	}), 0)
	c, br := dialRaw(t, addr)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\nnext line\n")
	if _, body := readResp(t, br, "GET"); body != "next line\n" {
		t.Fatalf("got %q", body)
	}
}

// TestH1ShutdownWaitsAndClosesIdle: Shutdown closes an idle kept
// connection at once, lets a running handler finish (its answer says
// Connection: close), then returns.
func TestH1ShutdownWaitsAndClosesIdle(t *testing.T) {
	release := make(chan struct{})
	var done atomic.Bool
	s, addr := startOwn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-release
			done.Store(true)
		}
		io.WriteString(w, "ok")
	}), 0)
	idle, ibr := dialRaw(t, addr)
	io.WriteString(idle, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	readResp(t, ibr, "GET")
	busy, bbr := dialRaw(t, addr)
	io.WriteString(busy, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
	time.Sleep(50 * time.Millisecond)
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(context.Background()) }()
	if !closedWithin(idle, 2*time.Second) {
		t.Fatal("the idle connection outlived the shutdown's start by 2s")
	}
	select {
	case <-shut:
		t.Fatal("Shutdown returned while a handler ran")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	resp, body := readResp(t, bbr, "GET")
	if body != "ok" || !resp.Close || !done.Load() {
		t.Fatalf("running request: got %q close=%v", body, resp.Close)
	}
	select {
	case <-shut:
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return after the handler")
	}
}

// TestH1IdleTimeout: a kept connection idle past IdleTimeout is closed.
func TestH1IdleTimeout(t *testing.T) {
	_, addr := startOwn(t, echo(), 300*time.Millisecond)
	c, br := dialRaw(t, addr)
	t0 := time.Now() // before the response the idle time counts from
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	readResp(t, br, "GET")
	if !closedWithin(c, 3*time.Second) {
		t.Fatal("kept connection open 3s past its idle timeout")
	}
	if d := time.Since(t0); d < 200*time.Millisecond {
		t.Fatalf("closed after %v; want about 300ms", d)
	}
}

// TestH1ResponseShapes: a small answer gets its length and a sniffed type
// in one piece; HEAD and 204 carry no body; a declared length is kept;
// ResponseController deadlines reach the socket.
func TestH1ResponseShapes(t *testing.T) {
	_, addr := startOwn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if err := rc.SetWriteDeadline(time.Now().Add(time.Second)); err != nil {
			t.Error(err)
		}
		switch r.URL.Path {
		case "/204":
			w.WriteHeader(http.StatusNoContent)
		case "/len":
			w.Header().Set("Content-Length", "5")
			io.WriteString(w, "12345")
		default:
			io.WriteString(w, "<html>hi</html>")
		}
	}), 0)
	c, br := dialRaw(t, addr)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\nHEAD / HTTP/1.1\r\nHost: x\r\n\r\nGET /204 HTTP/1.1\r\nHost: x\r\n\r\nGET /len HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, body := readResp(t, br, "GET")
	if body != "<html>hi</html>" || resp.ContentLength != 15 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") || resp.Header.Get("Date") == "" {
		t.Fatalf("GET: %q %d %v", body, resp.ContentLength, resp.Header)
	}
	if resp, body = readResp(t, br, "HEAD"); body != "" || resp.StatusCode != 200 || resp.ContentLength != 15 {
		t.Fatalf("HEAD: %d %q length %d; want the GET's 15", resp.StatusCode, body, resp.ContentLength)
	}
	if resp, body = readResp(t, br, "GET"); body != "" || resp.StatusCode != 204 || resp.Header.Get("Content-Length") != "" {
		t.Fatalf("204: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	if resp, body = readResp(t, br, "GET"); body != "12345" || resp.ContentLength != 5 || resp.Close {
		t.Fatalf("declared length: %q %d close=%v", body, resp.ContentLength, resp.Close)
	}
}

// TestH1AbortHandlerCuts: a handler panicking with http.ErrAbortHandler
// cuts its streamed answer (no last chunk): the client sees an error, not
// a clean end.
func TestH1AbortHandlerCuts(t *testing.T) {
	_, addr := startOwn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}), 0)
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.ReadAll(resp.Body); err == nil || false {
		t.Fatal("a cut answer read as complete")
	}
}

// TestH1StaleWatchTimerLeavesNextBodyAlone: the watcher's timer (armed at
// a body's end) may fire just as its handler returns, when Stop can no
// longer stop it; it must not start a watcher on the next request while
// that request's handler still reads its body from the same reader. A
// watch delay near the handlers' run time and bodies sent in two parts
// make the timer's firing land around the handlers' ends; every echoed
// body must come back whole (and the race detector sees no shared read).
func TestH1StaleWatchTimerLeavesNextBodyAlone(t *testing.T) {
	t.Setenv("SLUICE_H1_WATCH_DELAY", "100us")
	var n atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		time.Sleep(time.Duration(50+n.Add(1)%100) * time.Microsecond)
		w.Write(b)
	})
	_, addr := startOwn(t, h, time.Minute)
	c, br := dialRaw(t, addr)
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; i < 400 && time.Now().Before(deadline); i++ {
		body := fmt.Sprintf("first-half-%04d|second-half-%04d", i, i)
		head := fmt.Sprintf("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", len(body))
		half := len(body) / 2
		if _, err := io.WriteString(c, head+body[:half]); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(i%3) * 100 * time.Microsecond)
		if _, err := io.WriteString(c, body[half:]); err != nil {
			t.Fatal(err)
		}
		resp, got := readResp(t, br, http.MethodPost)
		if resp.StatusCode != http.StatusOK || got != body {
			t.Fatalf("request %d: %d %q, want 200 %q", i, resp.StatusCode, got, body)
		}
	}
}

// TestH1HeadInPieces: a head and body arriving a few bytes at a time (the
// fast parser waits for the head's end, reading more) are read as one
// request, and the next request on the connection after it too.
func TestH1HeadInPieces(t *testing.T) {
	_, addr := startOwn(t, echo(), 0)
	c, br := dialRaw(t, addr)
	req := "POST /in-pieces HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello"
	for i := 0; i < len(req); i += 7 {
		if _, err := io.WriteString(c, req[i:min(i+7, len(req))]); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if _, body := readResp(t, br, "POST"); body != "POST /in-pieces hello" {
		t.Fatalf("got %q; want %q", body, "POST /in-pieces hello")
	}
	io.WriteString(c, "GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, body := readResp(t, br, "GET"); body != "GET /next " {
		t.Fatalf("got %q; want %q", body, "GET /next ")
	}
}

// TestH1ShortBodyCloses: a body shorter than its Content-Length when the
// client stops sending is an unexpected EOF to the handler.
func TestH1ShortBodyCloses(t *testing.T) {
	got := make(chan error, 1)
	_, addr := startOwn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		got <- err
	}), 0)
	c, _ := dialRaw(t, addr)
	io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
	c.(*net.TCPConn).CloseWrite()
	select {
	case err := <-got:
		if err != io.ErrUnexpectedEOF {
			t.Fatalf("got %v; want %v", err, io.ErrUnexpectedEOF)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handler did not see the body end")
	}
}

// TestH1HeaderMapReused: a kept connection's next response gets the last
// response's header map, emptied: no field of the first answer reaches the
// second, a map that grew past the bound is not kept, and Header called
// after the handler returned is a map of its own, which the next response
// does not see.
func TestH1HeaderMapReused(t *testing.T) {
	var mu sync.Mutex
	var maps []uintptr
	late := make(chan http.ResponseWriter, 1)
	_, addr := startOwn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		maps = append(maps, reflect.ValueOf(w.Header()).Pointer())
		mu.Unlock()
		switch r.URL.Path {
		case "/a":
			w.Header().Set("X-First", "1")
			late <- w
		case "/big":
			for i := range 40 {
				w.Header().Set(fmt.Sprintf("X-Big-%d", i), "v")
			}
		}
		io.WriteString(w, r.URL.Path)
	}), 0)
	c, br := dialRaw(t, addr)
	for i, path := range []string{"/a", "/b", "/big", "/c", "/d"} {
		if i == 2 {
			// After /a's handler returned and /b reused its map: a late
			// Header is a map of its own, not the one /b had.
			h := (<-late).Header()
			mu.Lock()
			same := reflect.ValueOf(h).Pointer() == maps[1]
			mu.Unlock()
			if same {
				t.Fatal("Header after the handler returned is the next response's map")
			}
			h.Set("X-Late", "1")
		}
		io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, body := readResp(t, br, "GET")
		if body != path {
			t.Fatalf("%s: body %q", path, body)
		}
		if path != "/a" && (resp.Header.Get("X-First") != "" || resp.Header.Get("X-Late") != "") {
			t.Fatalf("%s: a field of an earlier answer or a late Header: %v", path, resp.Header)
		}
		if path == "/c" && resp.Header.Get("X-Big-1") != "" {
			t.Fatalf("/c: a field of /big's answer: %v", resp.Header)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if maps[1] != maps[0] || maps[2] != maps[1] {
		t.Errorf("the header map was not reused on the kept connection: %x", maps)
	}
	if maps[3] == maps[2] {
		t.Errorf("a map grown past %d fields was kept", 32)
	}
	if maps[4] != maps[3] {
		t.Errorf("the map after the grown one was not reused: %x", maps)
	}
}

// BenchmarkRequestContext: a request context's start and end as the own
// server makes them (readRequest's WithCancelCause, finish's cancel), on
// every core at once, under a parent that can be cancelled — the server's
// base, which all requests shared until connBase — and under one that
// cannot (connBase: the base without its cancellation).
func BenchmarkRequestContext(b *testing.B) {
	base, stop := context.WithCancelCause(context.Background())
	defer stop(nil)
	for _, bc := range []struct {
		name   string
		parent context.Context
	}{
		{"base", context.WithValue(base, http.LocalAddrContextKey, "x")},
		{"connBase", context.WithValue(context.WithoutCancel(base), http.LocalAddrContextKey, "x")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					_, cancel := context.WithCancelCause(bc.parent)
					cancel(nil)
				}
			})
		})
	}
}
