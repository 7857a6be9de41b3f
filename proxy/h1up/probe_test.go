package h1up

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// closingBackend answers one request per connection and then closes it
// without saying so (a backend shutting down, or a keep-alive timeout
// shorter than the client's ProbeAfter). It counts the requests it read.
func closingBackend(t *testing.T) (*rawServer, *atomic.Int32, chan struct{}) {
	var reqs atomic.Int32
	closed := make(chan struct{}, 16)
	raw := newRawServer(t, func(c net.Conn) {
		if readRequest(t, bufio.NewReader(c)) == nil {
			return
		}
		reqs.Add(1)
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		c.Close()
		closed <- struct{}{}
	})
	return raw, &reqs, closed
}

func post(url string) *http.Request {
	req, _ := http.NewRequest(http.MethodPost, url, io.NopCloser(strings.NewReader("x"))) // no GetBody
	req.ContentLength = 1
	return req
}

// bigPost is a POST whose body does not fit the request writer's buffer:
// it takes its connection at the writer's first flush and is written
// through the net.Conn (no sendWait), so ProbeAfter's skip applies to it.
func bigPost(url string) *http.Request {
	body := strings.Repeat("x", 10<<10)
	req, _ := http.NewRequest(http.MethodPost, url, io.NopCloser(strings.NewReader(body))) // no GetBody
	req.ContentLength = int64(len(body))
	return req
}

// With ProbeAfter, a connection back in the pool a moment ago is reused
// unchecked by a request too big for sendWait. When the backend had
// closed it, a POST written on it fails (it is never sent again:
// RoundTrip's rule), the backend read no second request, and the host's
// idle connections are checked again, so the next request succeeds on a
// new connection.
func TestProbeAfterSkipsCheck(t *testing.T) {
	raw, reqs, closed := closingBackend(t)
	tr := New(Options{ProbeAfter: time.Hour})
	defer tr.CloseIdleConnections()
	resp, err := tr.RoundTrip(post(raw.url()))
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	<-closed
	if _, err := tr.RoundTrip(bigPost(raw.url())); err == nil {
		t.Fatal("a POST on a connection the backend closed succeeded: was the liveness check made?")
	}
	if got := reqs.Load(); got != 1 {
		t.Fatalf("backend read %d requests; want 1 (the failed POST never reached it, and was not resent)", got)
	}
	for i := range 3 { // suspect: each reuse is checked, each dead connection replaced
		resp, err := tr.RoundTrip(post(raw.url()))
		if err != nil {
			t.Fatalf("POST %d after the failure: %v", i, err)
		}
		readAll(t, resp)
		<-closed
	}
	if got, acc := reqs.Load(), raw.accepts.Load(); got != 4 || acc != 4 {
		t.Fatalf("backend read %d requests on %d connections; want 4 on 4", got, acc)
	}
}

// A request whole in the writer's buffer is sent by sendWait, whose peek
// right before the write is the liveness check: ProbeAfter skips nothing
// for it, and a POST on a connection the backend closed goes on a new one.
func TestProbeAfterSmallRequestChecked(t *testing.T) {
	requireSendWait(t)
	raw, reqs, closed := closingBackend(t)
	tr := New(Options{ProbeAfter: time.Hour})
	defer tr.CloseIdleConnections()
	for i := range 3 {
		resp, err := tr.RoundTrip(post(raw.url()))
		if err != nil {
			t.Fatalf("POST %d: %v", i, err)
		}
		readAll(t, resp)
		<-closed
	}
	if got, acc := reqs.Load(), raw.accepts.Load(); got != 3 || acc != 3 {
		t.Fatalf("backend read %d requests on %d connections; want 3 on 3", got, acc)
	}
}

// A GET (replayable, idempotent) that meets such a connection is retried
// on a new one, as net/http's Transport does, and the backend reads it once.
func TestProbeAfterRetriesGET(t *testing.T) {
	raw, reqs, closed := closingBackend(t)
	tr := New(Options{ProbeAfter: time.Hour})
	defer tr.CloseIdleConnections()
	for i := range 2 {
		resp, err := get(t, tr, context.Background(), raw.url())
		if err != nil {
			t.Fatalf("GET %d: %v", i, err)
		}
		readAll(t, resp)
		<-closed
	}
	if got, acc := reqs.Load(), raw.accepts.Load(); got != 2 || acc != 2 {
		t.Fatalf("backend read %d requests on %d connections; want 2 on 2", got, acc)
	}
}

// Zero (the default) checks every reuse: the dead connection is found
// before the POST is written (TestDeadIdleConn), and so is it with a
// ProbeAfter shorter than the connection's idle time.
func TestProbeAfterElapsed(t *testing.T) {
	raw, reqs, closed := closingBackend(t)
	tr := New(Options{ProbeAfter: 20 * time.Millisecond})
	defer tr.CloseIdleConnections()
	for i := range 3 {
		resp, err := tr.RoundTrip(post(raw.url()))
		if err != nil {
			t.Fatalf("POST %d: %v", i, err)
		}
		readAll(t, resp)
		<-closed
		time.Sleep(30 * time.Millisecond)
	}
	if got := reqs.Load(); got != 3 {
		t.Fatalf("backend read %d requests; want 3", got)
	}
}

// A real net/http backend whose keep-alive timeout (2 ms) races the
// client's reuses, with ProbeAfter far longer: requests may fail, but no
// request is ever read twice by the backend, POSTs (not replayable) or
// GETs (retried by the rule); most succeed. The same with every reuse
// checked (ProbeAfter 0), for the log's comparison.
func TestProbeAfterRaceIdleTimeout(t *testing.T) {
	for _, pa := range []time.Duration{time.Hour, 0} {
		t.Run(fmt.Sprint(pa), func(t *testing.T) { raceIdleTimeout(t, pa) })
	}
}

func raceIdleTimeout(t *testing.T, probeAfter time.Duration) {
	var mu sync.Mutex
	seen := map[string]int{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		seen[r.Header.Get("X-Id")]++
		mu.Unlock()
		io.WriteString(w, "ok")
	}))
	srv.Config.IdleTimeout = 2 * time.Millisecond
	srv.Start()
	defer srv.Close()
	tr := New(Options{ProbeAfter: probeAfter})
	defer tr.CloseIdleConnections()
	const workers, each = 8, 60
	var ok, failed atomic.Int32
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				var req *http.Request
				if i%2 == 0 {
					req = post(srv.URL)
				} else {
					req, _ = http.NewRequest(http.MethodGet, srv.URL, nil)
				}
				req.Header.Set("X-Id", fmt.Sprint(w, "-", i))
				resp, err := tr.RoundTrip(req)
				if err != nil {
					failed.Add(1)
				} else {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					ok.Add(1)
				}
				time.Sleep(time.Duration(i%4) * time.Millisecond) // around the backend's 2 ms
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for id, n := range seen {
		if n > 1 {
			t.Fatalf("request %s read %d times by the backend", id, n)
		}
	}
	if int(ok.Load()) != len(seen) {
		t.Fatalf("%d requests succeeded but the backend read %d", ok.Load(), len(seen))
	}
	if ok.Load() < workers*each/2 {
		t.Fatalf("only %d of %d requests succeeded (%d failed)", ok.Load(), workers*each, failed.Load())
	}
	t.Logf("ProbeAfter %v: %d succeeded, %d failed (POSTs on a connection the backend had just closed)", probeAfter, ok.Load(), failed.Load())
}

// copyLength writes bodies larger than the writer's buffer whole, from
// readers returning short reads, and refuses a body shorter or longer
// than its Content-Length; a small body costs no allocation of its own.
func TestCopyLength(t *testing.T) {
	srv, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%d %x", len(b), sum(b))
	})
	tr := New(Options{})
	defer tr.CloseIdleConnections()
	data := make([]byte, 100_000)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for _, n := range []int{1, 4000, 4096, 9000, len(data)} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, struct{ io.Reader }{iotestHalf(data[:n])})
		req.ContentLength = int64(n)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if got, want := readAll(t, resp), fmt.Sprintf("%d %x", n, sum(data[:n])); got != want {
			t.Fatalf("%d bytes: backend got %q; want %q", n, got, want)
		}
	}
	for _, tc := range []struct{ body, cl int }{{10, 11}, {12, 11}} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, struct{ io.Reader }{strings.NewReader(strings.Repeat("x", tc.body))})
		req.ContentLength = int64(tc.cl)
		if _, err := tr.RoundTrip(req); err == nil || !strings.Contains(err.Error(), "length") {
			t.Fatalf("body %d, Content-Length %d: err %v", tc.body, tc.cl, err)
		}
	}
	var sink bytes.Buffer
	bw := bufio.NewWriterSize(&sink, 4<<10)
	r := strings.NewReader("")
	allocs := testing.AllocsPerRun(100, func() {
		sink.Reset()
		r.Reset(`{"model":"m","messages":[]}`)
		if err := copyLength(bw, r, 27); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("copyLength: %v allocations; want 0", allocs)
	}
}

func sum(b []byte) uint32 {
	var s uint32
	for i, c := range b {
		s = s*31 + uint32(c) + uint32(i)
	}
	return s
}

// iotestHalf returns a reader of b whose reads return at most 1,000 bytes.
func iotestHalf(b []byte) io.Reader { return &short{b: b} }

type short struct{ b []byte }

func (s *short) Read(p []byte) (int, error) {
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), 1000)], s.b)
	s.b = s.b[n:]
	return n, nil
}
