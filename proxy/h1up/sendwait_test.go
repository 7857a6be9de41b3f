package h1up

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The tests of sendWait (a request whole in the writer's buffer written
// and its answer awaited in one RawConn.Read): a readiness edge lost
// between the write and the wait would leave a request parked until its
// context ends, so every request here has a deadline well below the
// test's and fails instead of hanging.

// instantServer answers each request the moment its head and body are
// read: the answer can arrive before the client's goroutine has parked.
// The body is echoed back as its length and a checksum.
func instantServer(t *testing.T) *rawServer {
	return newRawServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			b, err := io.ReadAll(req.Body)
			if err != nil {
				return
			}
			msg := fmt.Sprintf("%d:%d", len(b), sum(b))
			if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(len(msg))+"\r\n\r\n"+msg); err != nil {
				return
			}
		}
	})
}

func postBody(t *testing.T, tr *Transport, url string, body []byte) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, io.NopCloser(strings.NewReader(string(body))))
	req.ContentLength = int64(len(body))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("POST of %d bytes: %v", len(body), err)
	}
	return readAll(t, resp)
}

func requireSendWait(t *testing.T) {
	if !sendWaitOn {
		t.Skip("SLUICE_H1UP_SENDWAIT=0")
	}
}

// Many small requests, sequential and from 8 goroutines, against a
// backend that answers at once: none waits for its context.
func TestSendWaitInstantAnswer(t *testing.T) {
	requireSendWait(t)
	raw := instantServer(t)
	tr := New(Options{})
	defer tr.CloseIdleConnections()
	body := []byte(`{"model":"m","messages":[]}`)
	want := fmt.Sprintf("%d:%d", len(body), sum(body))
	n := 300
	if testing.Short() {
		n = 50
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				var req *http.Request
				if (g+i)%2 == 0 {
					req, _ = http.NewRequestWithContext(ctx, http.MethodGet, raw.url(), nil)
				} else {
					req, _ = http.NewRequestWithContext(ctx, http.MethodPost, raw.url(), io.NopCloser(strings.NewReader(string(body))))
					req.ContentLength = int64(len(body))
				}
				resp, err := tr.RoundTrip(req)
				if err != nil {
					cancel()
					errs <- fmt.Errorf("goroutine %d request %d: %w", g, i, err)
					return
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				cancel()
				if err != nil || (req.Method == http.MethodPost && string(got) != want) || (req.Method == http.MethodGet && string(got) != "0:0") {
					errs <- fmt.Errorf("goroutine %d request %d: body %q, %v", g, i, got, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if acc := raw.accepts.Load(); acc > 8 {
		t.Errorf("backend saw %d connections for 8 sequential clients; want ≤ 8 (kept connections)", acc)
	}
}

// Bodies around the writer's 4 KiB buffer and far past it: the ones whole
// in the buffer go through sendWait, the others through the net.Conn, on
// the same kept connection; every byte arrives.
func TestSendWaitBodySizes(t *testing.T) {
	requireSendWait(t)
	raw := instantServer(t)
	tr := New(Options{})
	defer tr.CloseIdleConnections()
	sizes := []int{1, 100, 1 << 20, 5000}
	for n := 3900; n <= 4300; n += 13 {
		sizes = append(sizes, n)
	}
	for _, n := range sizes {
		body := make([]byte, n)
		for i := range body {
			body[i] = byte('a' + (i*7+n)%26)
		}
		if got, want := postBody(t, tr, raw.url(), body), fmt.Sprintf("%d:%d", n, sum(body)); got != want {
			t.Fatalf("body of %d bytes: backend saw %q; want %q", n, got, want)
		}
	}
	if acc := raw.accepts.Load(); acc != 1 {
		t.Errorf("backend saw %d connections; want 1", acc)
	}
}

// A backend that speaks first on a new connection, its answer queued
// before the client's read readiness is reset (the dialer waits for it):
// the request is written, not waited on, and that answer read.
func TestSendWaitBackendSpeaksFirst(t *testing.T) {
	requireSendWait(t)
	stop := make(chan struct{})
	defer close(stop)
	raw := newRawServer(t, func(c net.Conn) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst")
		readRequest(t, bufio.NewReader(c))
		<-stop // then keep the connection open, answering nothing more
	})
	d := &net.Dialer{}
	tr := New(Options{Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := d.DialContext(ctx, network, addr)
		time.Sleep(20 * time.Millisecond) // the backend's bytes are in the socket
		return nc, err
	}})
	defer tr.CloseIdleConnections()
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := get(t, tr, ctx, raw.url())
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		if got := readAll(t, resp); got != "first" {
			t.Fatalf("body %q; want first", got)
		}
		cancel()
		tr.CloseIdleConnections()
	}
}

// A kept connection on which the backend sent bytes nobody asked for and
// kept it open (a 408 before a timeout that has not closed yet): the
// peek in sendWait finds them, nothing is written on it, and the POST
// goes on a new connection. The 408 is sent after the client read the
// first answer, so that the connection is kept, not closed for bytes
// that came with the answer's.
func TestSendWaitUnaskedBytes(t *testing.T) {
	requireSendWait(t)
	var mu sync.Mutex
	perConn := map[int]int{}
	var accepts atomic.Int32
	ln := listen(t)
	read := make(chan struct{}) // the client read the first answer
	var readOnce sync.Once
	readDone := func() { readOnce.Do(func() { close(read) }) }
	t.Cleanup(readDone) // (a failed test's backend is not left waiting)
	go func() {
		for id := 0; ; id++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepts.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					if readRequest(t, br) == nil {
						return
					}
					mu.Lock()
					perConn[id]++
					mu.Unlock()
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
					if id == 0 {
						<-read // (else it may come with the answer's bytes)
						io.WriteString(c, "HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n")
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	tr := New(Options{})
	defer tr.CloseIdleConnections()
	url := "http://" + ln.Addr().String()
	if got := postBody(t, tr, url, []byte("x")); got != "ok" {
		t.Fatalf("first POST: %q", got)
	}
	key := ln.Addr().String()
	if n := tr.idleCount(key); n != 1 {
		t.Fatalf("%d idle connections after the first POST; want 1", n)
	}
	readDone()
	// Wait until the 408 is in the kept connection's socket (its liveness
	// check fails), not a fixed time: a loaded machine may run the
	// backend's write, or the kernel's receive side of it, late.
	for deadline := time.Now().Add(5 * time.Second); !idleHasBytes(tr, key); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the 408 did not reach the kept connection in 5s")
		}
	}
	for i := range 3 {
		if got := postBody(t, tr, url, []byte("x")); got != "ok" {
			t.Fatalf("POST %d: %q", i, got)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if perConn[0] != 1 || accepts.Load() != 2 || perConn[1] != 3 {
		t.Fatalf("requests per connection %v on %d connections; want the first alone on the first, 3 on the second", perConn, accepts.Load())
	}
}

// idleHasBytes reports whether tr's one idle connection to key has bytes
// (or EOF) to read: its liveness check fails.
func idleHasBytes(tr *Transport, key string) bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	s := tr.idle[key]
	return len(s) == 1 && !s[0].alive()
}

// A request sendWait cannot write whole (the socket's send buffer full:
// EAGAIN, or a partial write) is finished through the net.Conn and its
// answer read as usual.
func TestSendWaitSendBufferFull(t *testing.T) {
	requireSendWait(t)
	ln := listen(t)
	filled := make(chan int, 1)
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		n := <-filled // read nothing until the client's buffer is full
		if _, err := io.CopyN(io.Discard, c, int64(n)); err != nil {
			done <- err
			return
		}
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			done <- err
			return
		}
		b, _ := io.ReadAll(req.Body)
		msg := fmt.Sprintf("%d:%d", len(b), sum(b))
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(len(msg))+"\r\n\r\n"+msg)
		done <- nil
		io.Copy(io.Discard, c)
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	tcp := nc.(*net.TCPConn)
	tcp.SetWriteBuffer(4096)
	fill := make([]byte, 64<<10)
	total := 0
	for {
		nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		n, err := nc.Write(fill)
		total += n
		if err != nil {
			if !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
				t.Fatal(err)
			}
			break
		}
	}
	nc.SetWriteDeadline(time.Time{})
	tr := New(Options{})
	defer tr.CloseIdleConnections()
	key := ln.Addr().String()
	c := &conn{nc: nc, key: key}
	c.initProbe()
	tr.putIdle(c)
	go func() {
		time.Sleep(100 * time.Millisecond) // the request meets the full buffer first
		filled <- total
	}()
	body := []byte("hello")
	if got, want := postBody(t, tr, "http://"+key, body), fmt.Sprintf("5:%d", sum(body)); got != want {
		t.Fatalf("backend saw %q; want %q", got, want)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// A request waiting in sendWait for an answer that never comes ends when
// its context does, with the context's error.
func TestSendWaitCancel(t *testing.T) {
	requireSendWait(t)
	raw := newRawServer(t, func(c net.Conn) {
		readRequest(t, bufio.NewReader(c))
		io.Copy(io.Discard, c)
	})
	tr := New(Options{})
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := get(t, tr, ctx, raw.url())
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v; want the context's deadline", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("returned after %v", d)
	}
}
