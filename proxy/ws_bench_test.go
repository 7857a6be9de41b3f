package proxy_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// seqOf returns the "seq" number in an event's data, or -1.
func seqOf(b []byte) int {
	i := bytes.Index(b, []byte(`"seq":`))
	if i < 0 {
		return -1
	}
	j := i + 6
	for j < len(b) && b[j] >= '0' && b[j] <= '9' {
		j++
	}
	n, err := strconv.Atoi(string(b[i+6 : j]))
	if err != nil {
		return -1
	}
	return n
}

// sseArrivals reads an SSE stream and calls got for each event's seq.
func sseArrivals(b *testing.B, client *http.Client, url string, n int, got func(int)) {
	resp := post(b, client, url+"/v1/chat/completions?n="+strconv.Itoa(n), chatBody(""))
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadSlice('\n')
		if s := seqOf(line); s >= 0 {
			got(s)
		}
		if err != nil {
			return
		}
	}
}

// wsArrivals runs one bridged request and calls got for each chunk's seq.
func wsArrivals(b *testing.B, url string, n int, got func(int)) {
	d := websocket.Dialer{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	c, _, err := d.Dial(url, keyHeader())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	c.WriteJSON(map[string]any{"type": "request", "id": "b", "path": "/v1/chat/completions?n=" + strconv.Itoa(n),
		"body": json.RawMessage(chatBody(""))})
	for {
		_, msg, err := c.ReadMessage()
		if err != nil {
			b.Fatal(err)
		}
		if s := seqOf(msg); s >= 0 {
			got(s)
			continue
		}
		if bytes.Contains(msg, []byte(`"type":"done"`)) || bytes.Contains(msg, []byte(`"type":"error"`)) {
			return
		}
	}
}

// BenchmarkWSEventDelay compares the WebSocket bridge with SSE in the same
// run: one event per millisecond from a paced backend, an op is one event.
// It reports the delay from the backend flushing an event to the client
// reading it (P50, P99) and the whole process's CPU time per 1,000 events
// (backend, Sluice and client together: compare the cases, the difference
// is the added cost).
//
//	go test ./proxy -run '^$' -bench WSEventDelay -benchtime 2000x -count 5
func BenchmarkWSEventDelay(b *testing.B) {
	for _, name := range []string{"direct", "sluice-h2", "sluice-wss", "sluice-h2c", "sluice-ws"} {
		b.Run(name, func(b *testing.B) {
			be := &pacedBackend{interval: time.Millisecond}
			srv := httptest.NewServer(be)
			defer srv.Close()
			e := startEdge(b, edgeOpts{pool: poolOf(srv.URL)})
			delays := make([]time.Duration, 0, b.N)
			got := func(seq int) {
				now := time.Now()
				be.mu.Lock()
				if seq < len(be.sent) {
					delays = append(delays, now.Sub(be.sent[seq]))
				}
				be.mu.Unlock()
			}
			cpu0 := cpuTime()
			b.ResetTimer()
			switch name {
			case "direct":
				sseArrivals(b, h1Client(), srv.URL, b.N, got)
			case "sluice-h2":
				sseArrivals(b, h2Client(), e.https, b.N, got)
			case "sluice-h2c":
				sseArrivals(b, h2cClient(), e.http, b.N, got)
			case "sluice-wss":
				wsArrivals(b, "wss"+strings.TrimPrefix(e.https, "https")+"/v1/ws", b.N, got)
			case "sluice-ws":
				wsArrivals(b, wsURL(e), b.N, got)
			}
			b.StopTimer()
			cpu := cpuTime() - cpu0
			if len(delays) != b.N {
				b.Fatalf("got %d events; want %d", len(delays), b.N)
			}
			slices.Sort(delays)
			b.ReportMetric(float64(delays[len(delays)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(delays[len(delays)*99/100].Microseconds()), "p99-µs")
			if cpu > 0 {
				b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-ms/1k-events")
			}
		})
	}
}

// BenchmarkWSRelay measures relaying one event as fast as it can go: an op
// is one event, from a backend that floods, through the bridge or SSE.
//
//	go test ./proxy -run '^$' -bench WSRelay -count 5
func BenchmarkWSRelay(b *testing.B) {
	srv := httptest.NewServer(floodBackend{})
	defer srv.Close()
	e := startEdge(b, edgeOpts{pool: poolOf(srv.URL)})
	for _, name := range []string{"sluice-h2c", "sluice-ws"} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			n := 0
			b.ResetTimer()
			if name == "sluice-ws" {
				d := websocket.Dialer{}
				c, _, err := d.Dial(wsURL(e), keyHeader())
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				c.WriteJSON(map[string]any{"type": "request", "id": "b", "path": "/v1/chat/completions?n=" + strconv.Itoa(b.N),
					"body": json.RawMessage(chatBody(""))})
				for {
					_, msg, err := c.ReadMessage()
					if err != nil {
						b.Fatal(err)
					}
					if bytes.HasPrefix(msg, []byte(`{"type":"chunk"`)) {
						n++
					} else {
						break
					}
				}
			} else {
				resp := post(b, h2cClient(), e.http+"/v1/chat/completions?n="+strconv.Itoa(b.N), chatBody(""))
				n = readStream(b, resp)
			}
			if n != b.N {
				b.Fatalf("got %d events; want %d", n, b.N)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
