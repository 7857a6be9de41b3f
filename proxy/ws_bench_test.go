package proxy_test

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// benchCase is one way to stream n events from the stamping backend.
type benchCase struct {
	name   string
	stream func(b *testing.B, n int, every time.Duration, delays []time.Duration) []time.Duration
}

// wsCase streams through the bridge on sockets kept open between streams
// (one per concurrent stream, as HTTP/1.1 keeps one connection each).
type wsCase struct {
	url  string
	idle chan *websocket.Conn
	ids  atomic.Int64
}

func newWSCase(url string) *wsCase { return &wsCase{url: url, idle: make(chan *websocket.Conn, 64)} }

func (c *wsCase) conn(b *testing.B) *websocket.Conn {
	select {
	case conn := <-c.idle:
		return conn
	default:
	}
	d := websocket.Dialer{TLSClientConfig: insecure()}
	conn, _, err := d.Dial(c.url, keyHeader())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return conn
}

// stream runs one bridged request and appends each event's delay from the
// backend writing it to the client reading its chunk frame.
func (c *wsCase) stream(b *testing.B, n int, every time.Duration, delays []time.Duration) []time.Duration {
	conn := c.conn(b)
	defer func() { c.idle <- conn }()
	id := strconv.FormatInt(c.ids.Add(1), 10)
	err := conn.WriteJSON(map[string]any{"type": "request", "id": id,
		"path": "/v1/chat/completions?n=" + strconv.Itoa(n) + "&every=" + every.String(), "body": json.RawMessage(chatBody(""))})
	if err != nil {
		b.Fatal(err)
	}
	got := 0
	var buf bytes.Buffer // reused: the client allocates nothing per frame
	for {
		_, rd, err := conn.NextReader()
		if err != nil {
			b.Fatal(err)
		}
		buf.Reset()
		if _, err := buf.ReadFrom(rd); err != nil {
			b.Fatal(err)
		}
		msg := buf.Bytes()
		if i := bytes.Index(msg, []byte(`"ns":`)); i >= 0 {
			now := time.Since(epoch)
			j := i + 5
			for j < len(msg) && msg[j] >= '0' && msg[j] <= '9' {
				j++
			}
			ns, _ := strconv.ParseInt(string(msg[i+5:j]), 10, 64)
			if delays != nil {
				delays = append(delays, now-time.Duration(ns))
			}
			got++
			continue
		}
		if bytes.HasPrefix(msg, []byte(`{"type":"done"`)) || bytes.HasPrefix(msg, []byte(`{"type":"error"`)) {
			break
		}
	}
	if got != n {
		b.Fatalf("ws: got %d events; want %d", got, n)
	}
	return delays
}

// wsBenchCases are the direct connection, SSE through Sluice over HTTP/2
// (TLS) and h2c, and the bridge over TLS (wss) and cleartext (ws); the hop
// from Sluice to the backend is HTTP/1.1 in every case.
func wsBenchCases(b *testing.B, backendURL string) []benchCase {
	e := startEdge(b, edgeOpts{pool: poolOf(backendURL)})
	sse := func(name, url string) benchCase {
		c := protoCase{name, url, h2Client()}
		if strings.HasPrefix(url, "http://") {
			c.client = h2cClient()
		}
		return benchCase{name, c.stream}
	}
	return []benchCase{
		{"direct", protoCase{"direct", backendURL, h1Pool()}.stream},
		sse("h2", e.https),
		{"wss", newWSCase("wss" + strings.TrimPrefix(e.https, "https") + "/v1/ws").stream},
		sse("h2c", e.http),
		{"ws", newWSCase(wsURL(e)).stream},
	}
}

// BenchmarkWSBridge compares the WebSocket bridge with SSE over HTTP/2 and
// a direct connection, in one run, the cases taking turns within each op
// (BenchmarkProtocols' method).
//
// delay: an op is a round of 500 events paced at 1 ms through each case;
// it reports the P50 and P99 delay from the backend writing an event to
// the client reading it, and the ratio to direct ("wss-p50-x").
//
// cpu: an op is a round of 20 concurrent streams of 250 events paced at
// 2 ms (5,000 events) through each case; it reports the process's CPU time
// (backend, Sluice and client together) per 1,000 events and the ratio to
// direct. Subtract direct to get the added cost; each client's own cost for
// its protocol is included.
//
//	go test -run '^$' -bench BenchmarkWSBridge -benchtime 4x -count 5 ./proxy/
func BenchmarkWSBridge(b *testing.B) {
	srv := httptest.NewServer(stampBackend{})
	defer srv.Close()
	benchStreams(b, func(b *testing.B) []benchCase { return wsBenchCases(b, srv.URL) })
}

// BenchmarkWSRelay measures relaying one event as fast as it can go: an op
// is one event from a flooding backend, through the bridge or SSE over h2c.
// Allocations include the test client's (gorilla's ReadMessage allocates
// each message; the bridge itself allocates nothing per event).
//
//	go test -run '^$' -bench BenchmarkWSRelay -count 5 ./proxy/
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
				n = wsFlood(b, wsURL(e), b.N)
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

// wsFlood runs one bridged request for n flooded events and counts chunks.
func wsFlood(b *testing.B, url string, n int) int {
	c, _, err := websocket.DefaultDialer.Dial(url, keyHeader())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	c.WriteJSON(map[string]any{"type": "request", "id": "b", "path": "/v1/chat/completions?n=" + strconv.Itoa(n),
		"body": json.RawMessage(chatBody(""))})
	got := 0
	for {
		_, msg, err := c.ReadMessage()
		if err != nil {
			b.Fatal(err)
		}
		if !bytes.HasPrefix(msg, []byte(`{"type":"chunk"`)) {
			return got
		}
		got++
	}
}
