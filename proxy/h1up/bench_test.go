package h1up

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// The benchmarks compare h1up with net/http's Transport, configured as
// proxy.NewTransport configures it, against the same raw loopback
// backends, so that the client's cost is what differs:
//
//	go test -run '^$' -bench . -benchmem -count 6 ./proxy/h1up/

func netHTTPTransport() *http.Transport {
	return &http.Transport{
		MaxIdleConns: 4096, MaxIdleConnsPerHost: 1024, IdleConnTimeout: 90 * time.Second,
		DisableCompression: true, ReadBufferSize: 4 << 10, WriteBufferSize: 4 << 10,
	}
}

type benchClient struct {
	name string
	rt   func() http.RoundTripper
}

var benchClients = []benchClient{
	{"h1up", func() http.RoundTripper { return New(Options{}) }},
	{"h1up-probe-after", func() http.RoundTripper { return New(Options{ProbeAfter: time.Second}) }},
	{"nethttp", func() http.RoundTripper { return netHTTPTransport() }},
}

// fixedServer answers every request on a connection with the same small
// response, reading only the head (the benchmark's requests have no body).
func fixedServer(b *testing.B) string {
	b.Helper()
	resp := []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 17\r\n\r\n{\"object\":\"list\"}")
	s := newRawServer(b, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			for { // up to the empty line ending the head
				line, err := br.ReadSlice('\n')
				if err != nil {
					return
				}
				if len(line) <= 2 {
					break
				}
			}
			if _, err := c.Write(resp); err != nil {
				return
			}
		}
	})
	return s.url()
}

// BenchmarkRoundTrip is one small non-streamed request on a kept-alive
// connection: write, head, 17-byte body, back to the pool.
func BenchmarkRoundTrip(b *testing.B) {
	url := fixedServer(b)
	for _, bc := range benchClients {
		b.Run(bc.name, func(b *testing.B) {
			rt := bc.rt()
			defer rt.(interface{ CloseIdleConnections() }).CloseIdleConnections()
			req, _ := http.NewRequest(http.MethodGet, url+"/v1/models", nil)
			req.Header.Set("Authorization", "Bearer sk-test")
			req.Header.Set("Accept", "application/json")
			buf := make([]byte, 64)
			b.ReportAllocs()
			for b.Loop() {
				resp, err := rt.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				for {
					_, err := resp.Body.Read(buf)
					if err == io.EOF {
						break
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				resp.Body.Close()
			}
		})
	}
}

// BenchmarkStreamEvent is one SSE event of a chunked stream, the backend
// sending the next one only when the client has read the last (a token at
// a time, as a model streams): ns/op and allocs/op are per event.
func BenchmarkStreamEvent(b *testing.B) {
	event := []byte("data: {\"choices\":[{\"delta\":{\"content\":\" token\"}}]}\n\n")
	chunk := append(append(strconv.AppendInt(nil, int64(len(event)), 16), "\r\n"...), event...)
	chunk = append(chunk, "\r\n"...)
	ack := make(chan int, 1)
	s := newRawServer(b, func(c net.Conn) {
		br := bufio.NewReader(c)
		if readRequest(nil, br) == nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		for {
			n, ok := <-ack // how many events to send, one write each
			if !ok || n == 0 {
				io.WriteString(c, "0\r\n\r\n")
				return
			}
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	})
	defer close(ack)
	for _, bc := range benchClients {
		b.Run(bc.name, func(b *testing.B) {
			rt := bc.rt()
			defer rt.(interface{ CloseIdleConnections() }).CloseIdleConnections()
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, s.url()+"/v1/chat/completions", nil)
			resp, err := rt.RoundTrip(req)
			if err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, len(event))
			b.ReportAllocs()
			for b.Loop() {
				ack <- 1
				if _, err := io.ReadFull(resp.Body, buf); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if !bytes.Equal(buf, event) {
				b.Fatalf("event %q", buf)
			}
			ack <- 0
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
}
