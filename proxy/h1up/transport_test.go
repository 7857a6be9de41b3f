package h1up

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/chunked"
)

// rawServer is a TCP backend on loopback that runs handle for each
// connection: for heads net/http would never send.
type rawServer struct {
	ln      net.Listener
	accepts atomic.Int32
	wg      sync.WaitGroup
}

func newRawServer(t testing.TB, handle func(c net.Conn)) *rawServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &rawServer{ln: ln}
	var conns sync.Map
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepts.Add(1)
			conns.Store(c, true)
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				handle(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		conns.Range(func(k, _ any) bool { k.(net.Conn).Close(); return true })
		s.wg.Wait()
	})
	return s
}

func (s *rawServer) url() string { return "http://" + s.ln.Addr().String() }

// readRequest reads one request (head and body) from br.
func readRequest(t testing.TB, br *bufio.Reader) *http.Request {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil
	}
	io.Copy(io.Discard, req.Body)
	return req
}

func get(t *testing.T, tr *Transport, ctx context.Context, url string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tr.RoundTrip(req)
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	resp.Body.Close()
	return string(b)
}

// countingServer is a net/http backend that counts the connections it
// accepted.
func countingServer(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			n.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &n
}

func TestKeepAliveReuse(t *testing.T) {
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s", r.URL.Path)
	})
	tr := New(Options{})
	defer tr.CloseIdleConnections()
	for i := range 5 {
		resp, err := get(t, tr, context.Background(), fmt.Sprintf("%s/%d", srv.URL, i))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := readAll(t, resp), fmt.Sprintf("hello /%d", i); got != want {
			t.Fatalf("body %q; want %q", got, want)
		}
	}
	if got := conns.Load(); got != 1 {
		t.Fatalf("backend saw %d connections; want 1 (reused)", got)
	}
	if got := tr.idleCount(strings.TrimPrefix(srv.URL, "http://")); got != 1 {
		t.Fatalf("idle pool holds %d; want 1", got)
	}
}

func TestBodyFramings(t *testing.T) {
	payload := strings.Repeat("0123456789", 1000) // larger than the read buffer
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/length":
			w.Header().Set("Content-Length", fmt.Sprint(len(payload)))
			io.WriteString(w, payload)
		case "/chunked":
			for i := 0; i < len(payload); i += 777 {
				io.WriteString(w, payload[i:min(i+777, len(payload))])
				w.(http.Flusher).Flush()
			}
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		}
	})
	tr := New(Options{})
	defer tr.CloseIdleConnections()
	for _, path := range []string{"/length", "/chunked", "/empty", "/length"} {
		resp, err := get(t, tr, context.Background(), srv.URL+path)
		if err != nil {
			t.Fatal(err)
		}
		want := payload
		if path == "/empty" {
			want = ""
		}
		if got := readAll(t, resp); got != want {
			t.Fatalf("%s: body of %d bytes; want %d", path, len(got), len(want))
		}
		if path == "/chunked" && (resp.ContentLength != -1 || len(resp.TransferEncoding) != 1) {
			t.Fatalf("chunked: ContentLength %d, TransferEncoding %q", resp.ContentLength, resp.TransferEncoding)
		}
	}
	if got := conns.Load(); got != 1 {
		t.Fatalf("backend saw %d connections; want 1", got)
	}

	// Close-delimited, from a raw backend: HTTP/1.0 style.
	raw := newRawServer(t, func(c net.Conn) {
		readRequest(t, bufio.NewReader(c))
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n"+payload)
	})
	for range 2 {
		resp, err := get(t, tr, context.Background(), raw.url())
		if err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, resp); got != payload {
			t.Fatalf("close-delimited: body of %d bytes; want %d", len(got), len(payload))
		}
		if !resp.Close || resp.ContentLength != -1 {
			t.Fatalf("close-delimited: Close %v, ContentLength %d", resp.Close, resp.ContentLength)
		}
	}
	if got := raw.accepts.Load(); got != 2 {
		t.Fatalf("close-delimited backend saw %d connections; want 2 (never reused)", got)
	}
}

func TestRequestBody(t *testing.T) {
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %d %q %s", r.Method, r.ContentLength, r.TransferEncoding, b)
	})
	tr := New(Options{})
	defer tr.CloseIdleConnections()
	for _, tc := range []struct {
		name string
		cl   int64
		want string
	}{
		{"length", 5, `POST 5 [] hello`},
		{"chunked", -1, `POST -1 ["chunked"] hello`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eof := &eofWatch{r: strings.NewReader("hello")}
			req, _ := http.NewRequest(http.MethodPost, srv.URL, eof)
			req.ContentLength = tc.cl
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			if got := readAll(t, resp); got != tc.want {
				t.Fatalf("got %q; want %q", got, tc.want)
			}
			if !eof.seen || !eof.closed {
				t.Fatalf("request body read to io.EOF %v, closed %v; want both", eof.seen, eof.closed)
			}
		})
	}
	// A body shorter than its ContentLength is refused, not sent.
	req, _ := http.NewRequest(http.MethodPost, srv.URL, io.NopCloser(strings.NewReader("hi")))
	req.ContentLength = 5
	if _, err := tr.RoundTrip(req); !errors.Is(err, errBodyLength) {
		t.Fatalf("short body: err %v; want errBodyLength", err)
	}
}

// eofWatch records that its reader returned io.EOF, as the proxy's
// sentBody does.
type eofWatch struct {
	r      io.Reader
	seen   bool
	closed bool
}

func (e *eofWatch) Close() error { e.closed = true; return nil }

func (e *eofWatch) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF {
		e.seen = true
	}
	return n, err
}

var errCause = errors.New("test: client went away")

func TestCancelBeforeHead(t *testing.T) {
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	tr := New(Options{})
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		<-arrived
		cancel(errCause)
	}()
	resp, err := get(t, tr, ctx, srv.URL)
	if resp != nil || !errors.Is(err, errCause) {
		t.Fatalf("RoundTrip: resp %v, err %v; want the context's cause", resp, err)
	}
	if got := tr.idleCount(strings.TrimPrefix(srv.URL, "http://")); got != 0 {
		t.Fatalf("idle pool holds %d after a cancel; want 0", got)
	}
}

func TestCancelDuringBody(t *testing.T) {
	release := make(chan struct{})
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	tr := New(Options{})
	ctx, cancel := context.WithCancelCause(context.Background())
	resp, err := get(t, tr, ctx, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := resp.Body.Read(buf)
	if err != nil || string(buf[:n]) != "first" {
		t.Fatalf("first read: %q, %v", buf[:n], err)
	}
	go func() {
		time.Sleep(20 * time.Millisecond) // let Read block on the socket (either order passes)
		cancel(errCause)
	}()
	_, err = resp.Body.Read(buf)
	if !errors.Is(err, errCause) {
		t.Fatalf("read after cancel: %v; want the context's cause", err)
	}
	if _, err := resp.Body.Read(buf); !errors.Is(err, errCause) {
		t.Fatalf("second read after cancel: %v; want the cause again", err)
	}
	resp.Body.Close()
}

// TestDetachMidChunk detaches a chunked body in the middle of a chunk and
// continues decoding raw and the socket's further bytes with dec, to the
// exact payload; the detached connection is never reused.
func TestDetachMidChunk(t *testing.T) {
	step := make(chan struct{})
	raw := newRawServer(t, func(c net.Conn) {
		if readRequest(t, bufio.NewReader(c)) == nil {
			return
		}
		// One write: head, a whole chunk and part of the next, so the
		// reader buffers bytes that Read has not returned yet.
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+
			"d\r\ndata: first\n\n\r\ne\r\ndata: sec")
		select {
		case <-step:
		case <-time.After(10 * time.Second):
			return
		}
		io.WriteString(c, "ond\n\n\r\n0\r\n\r\n")
	})
	tr := New(Options{})
	defer tr.CloseIdleConnections()
	resp, err := get(t, tr, context.Background(), raw.url())
	if err != nil {
		t.Fatal(err)
	}
	b := resp.Body.(*Body)
	first := make([]byte, 5) // a short read leaves bytes buffered
	n, err := io.ReadFull(b, first)
	if err != nil || string(first[:n]) != "data:" {
		t.Fatalf("first read: %q, %v", first[:n], err)
	}
	conn, rawBytes, dec, remaining, err := b.Detach()
	if err != nil {
		t.Fatal(err)
	}
	if dec == nil || remaining != 0 || len(rawBytes) == 0 {
		t.Fatalf("Detach: dec %v, remaining %d, raw %q", dec, remaining, rawBytes)
	}
	if _, err := b.Read(first); !errors.Is(err, ErrDetached) {
		t.Fatalf("Read after Detach: %v; want ErrDetached", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("Close after Detach: %v", err)
	}
	if _, _, _, _, err := b.Detach(); !errors.Is(err, ErrDetached) {
		t.Fatalf("second Detach: %v; want ErrDetached", err)
	}
	close(step)
	got, done := decodeRest(t, conn, rawBytes, dec)
	conn.Close()
	if want := " first\n\ndata: second\n\n"; string(got) != want || !done {
		t.Fatalf("continued decoding: %q (done %v); want %q", got, done, want)
	}
	// The detached connection never went back to the pool: the next request dials.
	resp, err = get(t, tr, context.Background(), raw.url())
	if err == nil {
		readAll(t, resp)
	}
	if got := raw.accepts.Load(); got != 2 {
		t.Fatalf("backend saw %d connections; want 2 (detached conn not reused)", got)
	}
}

// decodeRest decodes raw and then conn's bytes with dec to the end of the body.
func decodeRest(t *testing.T, conn net.Conn, raw []byte, dec *chunked.Decoder) ([]byte, bool) {
	t.Helper()
	var out []byte
	src := raw
	buf := make([]byte, 3) // tiny reads: every split of the framing
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		var done bool
		var err error
		out, _, done, err = dec.Decode(out, src)
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if done {
			return out, true
		}
		n, err := conn.Read(buf)
		if err != nil {
			return out, false
		}
		src = buf[:n]
	}
}

func TestDetachContentLength(t *testing.T) {
	raw := newRawServer(t, func(c net.Conn) {
		readRequest(t, bufio.NewReader(c))
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789")
	})
	tr := New(Options{})
	resp, err := get(t, tr, context.Background(), raw.url())
	if err != nil {
		t.Fatal(err)
	}
	b := resp.Body.(*Body)
	p := make([]byte, 4)
	if _, err := io.ReadFull(b, p); err != nil {
		t.Fatal(err)
	}
	conn, rawBytes, dec, remaining, err := b.Detach()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if dec != nil || remaining != 6 || string(rawBytes) != "456789" {
		t.Fatalf("Detach: dec %v, remaining %d, raw %q; want nil, 6, %q", dec, remaining, rawBytes, "456789")
	}
}

func TestDetachAfterCancel(t *testing.T) {
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "x")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	tr := New(Options{})
	ctx, cancel := context.WithCancelCause(context.Background())
	resp, err := get(t, tr, ctx, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	cancel(errCause)
	if _, _, _, _, err := resp.Body.(*Body).Detach(); !errors.Is(err, errCause) {
		t.Fatalf("Detach after cancel: %v; want the cause", err)
	}
}

// TestDetachIgnoresCancel: after Detach the request's context no longer
// touches the connection.
func TestDetachIgnoresCancel(t *testing.T) {
	raw := newRawServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		readRequest(t, br)
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nab")
		br.ReadByte() // the client's ping after the cancel
		io.WriteString(c, "c")
	})
	tr := New(Options{})
	ctx, cancel := context.WithCancelCause(context.Background())
	resp, err := get(t, tr, ctx, raw.url())
	if err != nil {
		t.Fatal(err)
	}
	conn, rawBytes, _, _, err := resp.Body.(*Body).Detach()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cancel(errCause)
	if _, err := conn.Write([]byte("!")); err != nil {
		t.Fatalf("write on the detached conn after cancel: %v", err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	rest := make([]byte, 1)
	if _, err := io.ReadFull(conn, rest); err != nil {
		t.Fatalf("read on the detached conn after cancel: %v", err)
	}
	if got := string(rawBytes) + string(rest); got != "abc" {
		t.Fatalf("body %q; want %q", got, "abc")
	}
}

func TestMalformedHeads(t *testing.T) {
	for _, tc := range []struct{ name, head string }{
		{"cl and te", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"},
		{"te and cl", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"},
		{"two lengths", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello"},
		{"length list", "HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\nhello"},
		{"signed length", "HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello"},
		{"gzip te", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"},
		{"two te", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"},
		{"identity te", "HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\n"},
		{"te on 1.0", "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"},
		{"bad status", "HTTP/1.1 2x0 OK\r\n\r\n"},
		{"http2", "HTTP/2.0 200 OK\r\n\r\n"},
		{"junk", "SSH-2.0-OpenSSH\r\n\r\n"},
		{"space before colon", "HTTP/1.1 200 OK\r\nContent-Length : 5\r\n\r\nhello"},
		{"upgrade", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := newRawServer(t, func(c net.Conn) {
				readRequest(t, bufio.NewReader(c))
				io.WriteString(c, tc.head)
				io.Copy(io.Discard, c)
			})
			tr := New(Options{})
			resp, err := get(t, tr, context.Background(), raw.url())
			if err == nil {
				resp.Body.Close()
				t.Fatalf("accepted %q", tc.head)
			}
			if tc.name != "junk" && !errors.Is(err, ErrMalformedResponse) {
				t.Fatalf("err %v; want ErrMalformedResponse", err)
			}
		})
	}
}

func TestMalformedChunk(t *testing.T) {
	raw := newRawServer(t, func(c net.Conn) {
		readRequest(t, bufio.NewReader(c))
		io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n")
	})
	tr := New(Options{})
	resp, err := get(t, tr, context.Background(), raw.url())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(resp.Body); !errors.Is(err, ErrMalformedResponse) {
		t.Fatalf("err %v; want ErrMalformedResponse", err)
	}
}

func TestInterimResponses(t *testing.T) {
	raw := newRawServer(t, func(c net.Conn) {
		readRequest(t, bufio.NewReader(c))
		io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"+
			"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Final: yes\r\n\r\nok")
	})
	tr := New(Options{})
	defer tr.CloseIdleConnections()
	resp, err := get(t, tr, context.Background(), raw.url())
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Status != "200 OK" || resp.Header.Get("X-Final") != "yes" || resp.Header.Get("Link") != "" {
		t.Fatalf("got %d %q %v", resp.StatusCode, resp.Status, resp.Header)
	}
	if got := readAll(t, resp); got != "ok" {
		t.Fatalf("body %q", got)
	}
}

func TestIdleTimeout(t *testing.T) {
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	tr := New(Options{IdleConnTimeout: 50 * time.Millisecond})
	defer tr.CloseIdleConnections()
	key := strings.TrimPrefix(srv.URL, "http://")
	resp, err := get(t, tr, context.Background(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if got := tr.idleCount(key); got != 1 {
		t.Fatalf("idle %d; want 1", got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for tr.idleCount(key) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the idle connection was not closed by its timeout")
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp, err = get(t, tr, context.Background(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if got := conns.Load(); got != 2 {
		t.Fatalf("backend saw %d connections; want 2", got)
	}
}

// TestDeadIdleConn: a backend that closed an idle connection is noticed
// by the liveness check, and the request goes on a new connection. The
// requests are POSTs with bodies that cannot be rewound, which RoundTrip
// never retries: only the check can save them.
func TestDeadIdleConn(t *testing.T) {
	closed := make(chan struct{}, 4)
	raw := newRawServer(t, func(c net.Conn) {
		readRequest(t, bufio.NewReader(c))
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		c.Close() // a keep-alive timeout on the backend's side
		closed <- struct{}{}
	})
	tr := New(Options{})
	defer tr.CloseIdleConnections()
	for i := range 3 {
		req, _ := http.NewRequest(http.MethodPost, raw.url(), io.NopCloser(strings.NewReader("x")))
		req.ContentLength = 1
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		readAll(t, resp)
		<-closed // on loopback the FIN is queued on our socket once close returned
	}
	if got := raw.accepts.Load(); got != 3 {
		t.Fatalf("backend saw %d connections; want 3", got)
	}
}

// TestRetryStale: a GET that meets a connection the backend dropped after
// the liveness check passed is retried once on a new connection.
func TestRetryStale(t *testing.T) {
	raw := newRawServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		readRequest(t, br)
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		readRequest(t, br) // the second request arrives, and the backend hangs up without answering
	})
	tr := New(Options{})
	defer tr.CloseIdleConnections()
	for i := range 2 {
		resp, err := get(t, tr, context.Background(), raw.url())
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		readAll(t, resp)
	}
	if got := raw.accepts.Load(); got != 2 {
		t.Fatalf("backend saw %d connections; want 2 (one retry)", got)
	}
	// A POST without GetBody is not retried: the backend may have acted on it.
	req, _ := http.NewRequest(http.MethodPost, raw.url(), io.NopCloser(strings.NewReader("x")))
	req.ContentLength = 1
	if _, err := tr.RoundTrip(req); err == nil {
		t.Fatal("a POST that got no response succeeded")
	}
	if got := raw.accepts.Load(); got != 2 {
		t.Fatalf("backend saw %d connections; want 2 (no retry of the POST)", got)
	}
}

func TestCloseEarly(t *testing.T) {
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			io.WriteString(w, strings.Repeat("x", 1<<20))
			return
		}
		w.Header().Set("Content-Length", "10")
		io.WriteString(w, "0123456789")
	})
	tr := New(Options{})
	defer tr.CloseIdleConnections()
	// A small body already buffered: Close keeps the connection.
	resp, err := get(t, tr, context.Background(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Read(make([]byte, 2))
	resp.Body.Close()
	// A big one: Close drops it.
	resp, err = get(t, tr, context.Background(), srv.URL+"/big")
	if err != nil {
		t.Fatal(err)
	}
	if got := conns.Load(); got != 1 {
		t.Fatalf("backend saw %d connections; want 1 (closed small body reused)", got)
	}
	resp.Body.Read(make([]byte, 2))
	resp.Body.Close()
	if _, err := resp.Body.Read(make([]byte, 2)); !errors.Is(err, ErrBodyClosed) {
		t.Fatalf("Read after Close: %v", err)
	}
	resp, err = get(t, tr, context.Background(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if got := conns.Load(); got != 2 {
		t.Fatalf("backend saw %d connections; want 2", got)
	}
}

// TestConcurrentClose closes a body while a Read blocks on it.
func TestConcurrentClose(t *testing.T) {
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "x")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	tr := New(Options{})
	resp, err := get(t, tr, context.Background(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadFull(resp.Body, make([]byte, 1))
	errc := make(chan error, 1)
	go func() {
		_, err := resp.Body.Read(make([]byte, 8))
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	resp.Body.Close()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("Read returned no error after Close")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the Read")
	}
}

func TestParallel(t *testing.T) {
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Query().Get("chunked") != "" {
			w.(http.Flusher).Flush()
		}
		w.Write(bytes.ToUpper(b))
	})
	tr := New(Options{MaxIdleConnsPerHost: 4})
	defer tr.CloseIdleConnections()
	const workers, each = 8, 50
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				msg := fmt.Sprintf("msg-%d-%d", w, i)
				url := srv.URL
				if i%2 == 1 {
					url += "?chunked=1"
				}
				req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(msg))
				resp, err := tr.RoundTrip(req)
				if err != nil {
					errs <- err
					return
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || string(b) != strings.ToUpper(msg) {
					errs <- fmt.Errorf("got %q, %v; want %q", b, err, strings.ToUpper(msg))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := conns.Load(); got > workers+workers*each/4 {
		t.Fatalf("backend saw %d connections for %d requests: keep-alive not working", got, workers*each)
	}
	if got := tr.idleCount(strings.TrimPrefix(srv.URL, "http://")); got > 4 {
		t.Fatalf("idle pool holds %d; want at most 4", got)
	}
}

func TestScheme(t *testing.T) {
	tr := New(Options{})
	req, _ := http.NewRequest(http.MethodGet, "https://127.0.0.1:1/", nil)
	if _, err := tr.RoundTrip(req); !errors.Is(err, ErrScheme) {
		t.Fatalf("https: %v; want ErrScheme", err)
	}
}

func TestRequestHead(t *testing.T) {
	got := make(chan *http.Request, 1)
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) { got <- r })
	tr := New(Options{})
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/models?x=1", nil)
	req.Host = "example.test"
	req.Header.Set("X-A", "1")
	req.Header.Add("X-A", "2")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	r := <-got
	if r.Host != "example.test" || r.URL.String() != "/v1/models?x=1" || strings.Join(r.Header["X-A"], ",") != "1,2" {
		t.Fatalf("backend got Host %q, target %q, X-A %q", r.Host, r.URL, r.Header["X-A"])
	}
	req.Header.Set("X-Bad", "a\r\nInjected: 1")
	if _, err := tr.RoundTrip(req); err == nil {
		t.Fatal("a header value with CRLF was sent")
	}
}

// TestReaderReleasedBetweenReads: a stream waiting for its next event
// holds no read buffer, and reading on takes one again.
func TestReaderReleasedBetweenReads(t *testing.T) {
	step := make(chan struct{})
	raw := newRawServer(t, func(c net.Conn) {
		if readRequest(t, bufio.NewReader(c)) == nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\none\r\n")
		select {
		case <-step:
		case <-time.After(10 * time.Second):
			return
		}
		io.WriteString(c, "3\r\ntwo\r\n0\r\n\r\n")
	})
	tr := New(Options{})
	defer tr.CloseIdleConnections()
	resp, err := get(t, tr, context.Background(), raw.url())
	if err != nil {
		t.Fatal(err)
	}
	b := resp.Body.(*Body)
	buf := make([]byte, 4<<10)
	got := ""
	for got != "one" {
		n, err := b.Read(buf)
		if err != nil {
			t.Fatalf("first event: %v", err)
		}
		got += string(buf[:n])
	}
	b.mu.Lock()
	held := b.c.br != nil
	b.mu.Unlock()
	if held {
		t.Fatal("the body holds a read buffer while nothing is buffered")
	}
	if n, err := b.Read(nil); n != 0 || err != nil { // an empty read, with no reader held
		t.Fatalf("empty read: %d, %v", n, err)
	}
	close(step)
	rest, err := io.ReadAll(b)
	if err != nil || string(rest) != "two" {
		t.Fatalf("rest %q, %v; want %q", rest, err, "two")
	}
	if got := tr.IdleConns(); got != 1 {
		t.Fatalf("idle %d; want the connection back in the pool", got)
	}
}

// TestNoGoroutinePerConn holds 50 open streams with cancellable contexts:
// no goroutine runs in h1up's code for them (net/http's Transport, the
// control, shows one readLoop per connection).
func TestNoGoroutinePerConn(t *testing.T) {
	release := make(chan struct{})
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "x")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	const streams = 50
	for _, tc := range []struct {
		name, frame string
		rt          http.RoundTripper
		want        int
	}{
		{"h1up", "proxy/h1up.(*", New(Options{}), 0}, // any method of Transport, Body, conn
		{"nethttp", "net/http.(*persistConn).readLoop", netHTTPTransport(), streams},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var bodies []io.ReadCloser
			for range streams {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
				resp, err := tc.rt.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				io.ReadFull(resp.Body, make([]byte, 1))
				bodies = append(bodies, resp.Body)
			}
			buf := make([]byte, 8<<20)
			stacks := string(buf[:runtime.Stack(buf, true)])
			n := 0
			for _, g := range strings.Split(stacks, "\n\n") {
				if strings.Contains(g, tc.frame) && !strings.Contains(g, "TestNoGoroutinePerConn") {
					n++
				}
			}
			if n != tc.want {
				t.Fatalf("%d goroutines in %s; want %d", n, tc.frame, tc.want)
			}
			for _, b := range bodies {
				b.Close()
			}
		})
	}
}

// TestSpareOnDetach: a detached connection never returns to the pool, so
// with SpareOnDetach the transport dials a replacement in the background;
// the next request uses it without dialing. Without the option nothing is
// dialed ahead.
func TestSpareOnDetach(t *testing.T) {
	srv, conns := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "data: x\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done() // a stream: held until the client leaves
	})
	key := strings.TrimPrefix(srv.URL, "http://")
	for _, spare := range []bool{false, true} {
		t.Run(fmt.Sprint("spare=", spare), func(t *testing.T) {
			conns.Store(0)
			tr := New(Options{SpareOnDetach: spare})
			defer tr.CloseIdleConnections()
			detach := func() {
				resp, err := get(t, tr, context.Background(), srv.URL)
				if err != nil {
					t.Fatal(err)
				}
				nc, _, _, _, err := resp.Body.(*Body).Detach()
				if err != nil {
					t.Fatal(err)
				}
				nc.Close()
			}
			detach()
			want := 0
			if spare {
				want = 1
			}
			deadline := time.Now().Add(10 * time.Second)
			// The spare is parked when its dial returns; the backend counts
			// it when its accept loop runs, which may be later.
			for (tr.idleCount(key) < want || int(conns.Load()) < 1+want) && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			time.Sleep(20 * time.Millisecond) // a second spare, were one dialed, would show
			if got := tr.idleCount(key); got != want {
				t.Fatalf("idle pool holds %d after a detach; want %d", got, want)
			}
			before := conns.Load()
			if got := int(before); got != 1+want {
				t.Fatalf("backend saw %d connections; want %d", got, 1+want)
			}
			detach() // takes the spare (when there is one) and dials the next
			for tr.idleCount(key) < want && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			for conns.Load() < before+1 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if got := conns.Load(); got != before+1 {
				t.Fatalf("backend saw %d new connections for the second request; want 1 (the spare's replacement, or the request's own dial)", got-before)
			}
			if spare && tr.idleCount(key) != 1 {
				t.Fatalf("idle pool holds %d after the second detach; want 1", tr.idleCount(key))
			}
		})
	}
}

// TestSpareAfterClose: a spare whose dial ends after CloseIdleConnections
// is closed, not parked; a dial that fails parks nothing.
func TestSpareAfterClose(t *testing.T) {
	release := make(chan struct{})
	tr := New(Options{SpareOnDetach: true, Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		<-release
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}})
	ln := listen(t)
	tr.spare(ln.Addr().String())
	tr.CloseIdleConnections()
	close(release)
	deadline := time.Now().Add(10 * time.Second)
	for tr.spares.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := tr.spares.Load(); n != 0 {
		t.Fatalf("%d spare dials still running", n)
	}
	if n := tr.IdleConns(); n != 0 {
		t.Fatalf("a spare dialed across CloseIdleConnections was parked (%d idle)", n)
	}
	dead := ln.Addr().String()
	ln.Close()
	tr.spare(dead) // connection refused
	for tr.spares.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := tr.IdleConns(); n != 0 {
		t.Fatalf("a failed spare dial parked %d connections", n)
	}
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// TestReturnAfterDetach: a detached connection whose body the caller read
// to its end goes back to the pool with Return and serves the next
// request; one from a response that asked to close, or returned after
// CloseIdleConnections, is closed instead.
func TestReturnAfterDetach(t *testing.T) {
	raw := newRawServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req := readRequest(t, br)
			if req == nil {
				return
			}
			hdr := "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n"
			if req.URL.Path == "/close" {
				hdr += "Connection: close\r\n"
			}
			io.WriteString(c, hdr+"\r\nabcd")
		}
	})
	tr := New(Options{})
	defer tr.CloseIdleConnections()
	key := strings.TrimPrefix(raw.url(), "http://")
	detach := func(path string) (*Body, net.Conn) {
		t.Helper()
		resp, err := get(t, tr, context.Background(), raw.url()+path)
		if err != nil {
			t.Fatal(err)
		}
		b := resp.Body.(*Body)
		conn, rawBytes, _, remaining, err := b.Detach()
		if err != nil {
			t.Fatal(err)
		}
		// What the event loop does: read the rest of the body off the socket.
		rest := make([]byte, int(remaining)-len(rawBytes))
		if _, err := io.ReadFull(conn, rest); err != nil {
			t.Fatal(err)
		}
		return b, conn
	}
	b, conn := detach("/")
	if !b.Reusable() || !b.Return(conn) || tr.idleCount(key) != 1 {
		t.Fatalf("Reusable %v, idle %d after Return; want true, 1", b.Reusable(), tr.idleCount(key))
	}
	b, conn = detach("/") // on the returned connection
	if got := raw.accepts.Load(); got != 1 {
		t.Fatalf("backend saw %d connections; want 1 (the returned one reused)", got)
	}
	tr.CloseIdleConnections() // a reload, say: what was detached before does not come back
	if b.Return(conn) || tr.idleCount(key) != 0 {
		t.Fatalf("Return after CloseIdleConnections parked the connection (idle %d)", tr.idleCount(key))
	}
	b, conn = detach("/close")
	if b.Reusable() || b.Return(conn) || tr.idleCount(key) != 0 {
		t.Fatalf("a Connection: close response's connection was parked (idle %d)", tr.idleCount(key))
	}
}

// connCancelCtx is a ConnCanceler whose cancel reaches the exchange only
// through HoldConn's connection: its Done is nil (the Background's), so
// a context.AfterFunc on it would never run.
type connCancelCtx struct {
	context.Context
	mu              sync.Mutex
	cause           error
	conn            io.Closer
	holds, releases int
}

func (c *connCancelCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cause != nil {
		return context.Canceled
	}
	return nil
}

func (c *connCancelCtx) Cause() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cause
}

func (c *connCancelCtx) cancel(cause error) {
	c.mu.Lock()
	c.cause = cause
	conn := c.conn
	c.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
}

func (c *connCancelCtx) HoldConn(nc io.Closer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.holds++
	if c.cause != nil {
		nc.Close()
		return
	}
	c.conn = nc
}

func (c *connCancelCtx) ReleaseConn() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.releases++
	c.conn = nil
	return c.cause == nil
}

func (c *connCancelCtx) counts() (int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.holds, c.releases
}

// TestConnCanceler: on a ConnCanceler the exchange's connection is handed
// to the context (no context.AfterFunc): its cancel ends the wait for the
// head and a body's Read with its cause, and a body read to its end
// releases the connection back to the pool.
func TestConnCanceler(t *testing.T) {
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/head":
			arrived <- struct{}{}
		case "/body":
			io.WriteString(w, "first")
			w.(http.Flusher).Flush()
		default:
			io.WriteString(w, "whole")
			return
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	tr := New(Options{})
	host := strings.TrimPrefix(srv.URL, "http://")
	within := func(t *testing.T, what string, f func()) {
		t.Helper()
		done := make(chan struct{})
		go func() { f(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the cancel did not reach the connection", what)
		}
	}

	t.Run("whole", func(t *testing.T) {
		ctx := &connCancelCtx{Context: context.Background()}
		resp, err := get(t, tr, ctx, srv.URL+"/whole")
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != "whole" {
			t.Fatalf("body %q, %v", b, err)
		}
		if h, r := ctx.counts(); h != 1 || r != 1 {
			t.Fatalf("HoldConn %d, ReleaseConn %d; want 1 and 1", h, r)
		}
		if got := tr.idleCount(host); got != 1 {
			t.Fatalf("idle pool holds %d; want the connection back", got)
		}
	})
	t.Run("head", func(t *testing.T) {
		ctx := &connCancelCtx{Context: context.Background()}
		go func() {
			<-arrived
			ctx.cancel(errCause)
		}()
		within(t, "head", func() {
			resp, err := get(t, tr, ctx, srv.URL+"/head")
			if resp != nil || !errors.Is(err, errCause) {
				t.Errorf("RoundTrip: resp %v, err %v; want the context's cause", resp, err)
			}
		})
	})
	t.Run("body", func(t *testing.T) {
		ctx := &connCancelCtx{Context: context.Background()}
		resp, err := get(t, tr, ctx, srv.URL+"/body")
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		if n, err := resp.Body.Read(buf); err != nil || string(buf[:n]) != "first" {
			t.Fatalf("first read: %q, %v", buf[:n], err)
		}
		go func() {
			time.Sleep(20 * time.Millisecond)
			ctx.cancel(errCause)
		}()
		within(t, "body", func() {
			if _, err := resp.Body.Read(buf); !errors.Is(err, errCause) {
				t.Errorf("read after cancel: %v; want the context's cause", err)
			}
		})
		resp.Body.Close()
	})
	if got := tr.idleCount(host); got != 0 {
		t.Fatalf("idle pool holds %d after the cancels; want 0", got)
	}
}
