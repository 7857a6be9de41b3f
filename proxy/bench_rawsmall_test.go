package proxy_test

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/routing"
)

// rawAnswer is smallAnswer as a backend (vLLM's uvicorn) sends it: the
// head uvicorn writes (date, server, content-length, content-type) and the
// JSON body in one write.
var rawAnswer = []byte("HTTP/1.1 200 OK\r\ndate: Sun, 06 Dec 2026 01:00:00 GMT\r\nserver: uvicorn\r\n" +
	"content-length: " + strconv.Itoa(len(smallAnswer)) + "\r\ncontent-type: application/json\r\n\r\n" + smallAnswer)

// rawAnswerBackend answers every request on each connection with rawAnswer,
// reading requests with Content-Length bodies: no net/http, so that the
// process's allocations are the edge's.
func rawAnswerBackend(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReaderSize(c, 8192)
				for readRawMessage(br) == nil {
					if _, err := c.Write(rawAnswer); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// readRawMessage reads one HTTP/1.1 message with a Content-Length body (or
// none) from br without allocating per message.
func readRawMessage(br *bufio.Reader) error {
	n := 0
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return err
		}
		if len(line) <= 2 {
			break
		}
		if len(line) > 16 && bytes.EqualFold(line[:15], []byte("content-length:")) {
			v := bytes.TrimSpace(line[15:])
			n = 0
			for _, c := range v {
				n = n*10 + int(c-'0')
			}
		}
	}
	_, err := br.Discard(n)
	return err
}

// BenchmarkSmallPath sends small non-streamed requests, one at a time on
// one kept connection, through an edge with Sluice's own HTTP/1.1 client
// to a raw backend, from a raw client: neither side uses net/http, so
// "allocs/req" counts the edge's heap allocations per request (the raw
// sides make none per request) and "cpu-µs/req" is mostly the edge's (the
// raw sides' syscalls included). An op is one request.
func BenchmarkSmallPath(b *testing.B) {
	be := rawAnswerBackend(b)
	e := startEdge(b, edgeOpts{
		pool:        routing.PoolConfig{Name: "p", Backends: []routing.BackendConfig{{URL: "http://" + be}}},
		limiter:     limiter.NewLocal(1),
		limits:      limiter.Limits{MaxConcurrency: 1 << 20, TokensPerMinute: 1 << 50, RequestsPerMinute: 1 << 50},
		log:         io.Discard,
		promMetrics: true,
		h1up:        true,
	})
	body := `{"model":"sim-small","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
	req := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: " + e.http[len("http://"):] + "\r\nUser-Agent: bench\r\n" +
		"Authorization: Bearer " + testKey + "\r\nContent-Type: application/json\r\nAccept: */*\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	c, err := net.Dial("tcp", e.http[len("http://"):])
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReaderSize(c, 16384)
	one := func() {
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		line, err := br.ReadSlice('\n')
		if err != nil {
			b.Fatal(err)
		}
		if !bytes.HasPrefix(line, []byte("HTTP/1.1 200 ")) {
			b.Fatalf("status line %q", line)
		}
		if err := readRawMessage(br); err != nil {
			b.Fatal(err)
		}
	}
	for range 200 { // warm up: pools, buffers, the backend connection
		one()
	}
	time.Sleep(10 * time.Millisecond) // settles and logs of the warm-up end
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	cpu0 := cpuTime(b)
	b.ResetTimer()
	for range b.N {
		one()
	}
	b.StopTimer()
	cpu := cpuTime(b) - cpu0
	runtime.ReadMemStats(&ms1)
	n := float64(b.N)
	b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/n, "allocs/req")
	b.ReportMetric(float64(ms1.TotalAlloc-ms0.TotalAlloc)/n, "B/req")
	b.ReportMetric(float64(cpu.Nanoseconds())/n/1000, "cpu-µs/req")
}
