package proxy_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/proxy/listen"
)

// BenchmarkKeptIdle measures what an idle keep-alive client costs after
// its stream ended, with the kept connection re-admitted to the own
// HTTP/1.1 server ("serve": a goroutine waits for its next request) and
// parked on the event loop ("park", SLUICE_KEEP_ON_LOOP: no goroutine).
// k clients each run one short loop stream (10 tokens 20 ms apart: paced,
// so that it is handed to a loop) over their own connection,
// read it to its end and stay connected; the Go memory in use (heap and
// stacks, after a collection) is measured against the baseline before
// the clients connected, then the clients close. The clients' side is
// the same in both cases (raw connections, 4 KiB readers); so is the
// backend's (in process, its connections pooled). It reports the memory
// per idle client, the goroutines per idle client and the share parked,
// per case, and the difference ("park-minus-serve-KiB"). An op is one
// round of both.
func BenchmarkKeptIdle(b *testing.B) {
	const k = 1000
	srv := httptest.NewServer(stampBackend{})
	defer srv.Close()
	e := startEdge(b, heldEdgeOpts(poolOf(srv.URL), func(s *listen.Server) {
		s.HTTPServer = listen.HTTPServerSluice
		s.MaxConnsPerAddr = 4 * k
		s.FirstRequestTimeout = time.Minute // a re-admitted connection's bound
		s.IdleTimeout = time.Minute         // a parked connection's bound
	}, true))
	defer proxy.SetParkKept(false)
	cases := []string{"serve", "park"}
	mem := make([]float64, len(cases))
	gor := make([]float64, len(cases))
	parked := make([]float64, len(cases))
	round := func(i int) {
		proxy.SetParkKept(cases[i] == "park")
		m, g, p := keptIdle(b, e, k, cases[i] == "park")
		mem[i] += m
		gor[i] += g
		parked[i] += p
	}
	round(0) // pools and loops warm
	round(1)
	clear(mem)
	clear(gor)
	clear(parked)
	b.ResetTimer()
	for range b.N {
		for i := range cases {
			round(i)
		}
	}
	b.StopTimer()
	for i, c := range cases {
		b.ReportMetric(mem[i]/float64(b.N)/1024, c+"-KiB/client")
		b.ReportMetric(gor[i]/float64(b.N), c+"-goroutines/client")
		b.ReportMetric(parked[i]/float64(b.N), c+"-parked/client")
	}
	b.ReportMetric((mem[1]-mem[0])/float64(b.N)/1024, "park-minus-serve-KiB")
	b.ReportMetric(0, "ns/op")
}

// keptIdle runs k clients to their idle state (see BenchmarkKeptIdle) and
// returns the memory and goroutines grown per client and the share of
// the clients parked on the loops.
func keptIdle(b *testing.B, e *testEdge, k int, park bool) (mem, gor, parked float64) {
	b.Helper()
	addr := strings.TrimPrefix(e.http, "http://")
	body := chatBody("")
	req := "POST /v1/chat/completions?n=10&every=20ms HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + testKey +
		"\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	goroutines := runtime.NumGoroutine()
	base := heldMemory()
	conns := make([]net.Conn, k)
	var wg sync.WaitGroup
	var fails atomic.Int64
	for i := range k {
		wg.Go(func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				fails.Add(1)
				return
			}
			conns[i] = c
			c.SetDeadline(time.Now().Add(30 * time.Second))
			io.WriteString(c, req)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				fails.Add(1)
				return
			}
			_, err = io.Copy(io.Discard, resp.Body)
			if err != nil || resp.StatusCode != 200 || resp.Close {
				fails.Add(1)
			}
		})
	}
	wg.Wait()
	if n := fails.Load(); n > 0 {
		b.Fatalf("%d of %d clients failed", n, k)
	}
	if park {
		// A stream whose backend body was read whole with its first event
		// stays on its goroutine and is not parked (a loaded machine can
		// do that to a few): the count is reported, not required.
		poll(5*time.Second, func() bool { return e.handler.LoopParked() == int64(k) })
	} else {
		poll(5*time.Second, func() bool { return runtime.NumGoroutine() >= goroutines+k })
	}
	time.Sleep(200 * time.Millisecond) // the streams' completions end
	held := heldMemory()
	grown := runtime.NumGoroutine() - goroutines
	np := e.handler.LoopParked()
	for _, c := range conns {
		c.Close()
	}
	poll(10*time.Second, func() bool { return runtime.NumGoroutine() <= goroutines+10 && e.handler.LoopParked() == 0 })
	return float64(int64(held)-int64(base)) / float64(k), float64(grown) / float64(k), float64(np) / float64(k)
}
