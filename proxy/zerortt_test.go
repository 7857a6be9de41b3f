package proxy_test

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/sluice-proxy/sluice/proxy/listen"
)

// gatedConn is a client UDP socket that delivers nothing until opened: the
// client cannot finish its handshake, so everything it sends meanwhile is
// 0-RTT data, deterministically.
type gatedConn struct {
	net.PacketConn
	open chan struct{}
	once sync.Once
}

func (g *gatedConn) ReadFrom(b []byte) (int, net.Addr, error) {
	<-g.open
	return g.PacketConn.ReadFrom(b)
}

func (g *gatedConn) SetReadBuffer(int) error  { return nil } // quiet quic-go's buffer check
func (g *gatedConn) SetWriteBuffer(int) error { return nil }
func (g *gatedConn) release()                 { g.once.Do(func() { close(g.open) }) }
func (g *gatedConn) Close() error             { g.release(); return g.PacketConn.Close() }

// With allow_0rtt, a resuming client's GET in early data is served (and
// marked Early-Data: 1 for the backend); a POST in early data gets 425 Too
// Early.
func TestHTTP3ZeroRTT(t *testing.T) {
	logs := &logBuffer{}
	var mu sync.Mutex
	var seen []string // method, Early-Data, handshake complete, per request
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.Header.Get("Early-Data")+" "+map[bool]string{true: "done", false: "early"}[r.TLS.HandshakeComplete])
		mu.Unlock()
		io.WriteString(w, "ok")
	})
	srv := &listen.Server{Handler: h, HTTPSAddr: "127.0.0.1:0", TLSConfig: testTLSConfig(t),
		HTTP3: listen.HTTP3Config{Allow0RTT: true},
		Log:   slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	defer srv.Close()
	addr := srv.Addr(listen.ListenerHTTP3)
	tlsCfg := &tls.Config{InsecureSkipVerify: true, ClientSessionCache: tls.NewLRUClientSessionCache(4), NextProtos: []string{http3.NextProtoH3}}

	getTicket(t, addr, tlsCfg)
	conn, gate := dialGated(t, addr, tlsCfg, true)
	cc := (&http3.Transport{}).NewClientConn(conn)
	get := sendEarly(t, cc, http3.MethodGet0RTT, "https://"+addr+"/get")
	post := sendEarly(t, cc, http.MethodPost, "https://"+addr+"/post")
	// Both early requests must have reached the server before the gate
	// opens: each stream is handled on its own goroutine, and a request
	// the server only takes up after the handshake completed is no longer
	// early (its r.TLS is taken when the request is read). Waiting for the
	// POST's refusal alone left the GET to a loaded scheduler: it could be
	// read after the release and be served as "GET  done".
	waitFor(t, 5*time.Second, "the server to serve the early GET and refuse the early POST", func() bool {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		return n == 2 && len(logs.lines("0-RTT", `"method":"POST"`)) == 1
	})
	gate.release()
	if st := <-get; st != 200 {
		t.Fatalf("early GET: status %d; want 200", st)
	}
	if st := <-post; st != http.StatusTooEarly {
		t.Fatalf("early POST: status %d; want 425", st)
	}
	if !conn.ConnectionState().Used0RTT {
		t.Fatal("the second connection did not use 0-RTT; the test proves nothing")
	}
	// After the handshake the same connection serves POSTs.
	if st := <-sendEarly(t, cc, http.MethodPost, "https://"+addr+"/post"); st != 200 {
		t.Fatalf("POST after the handshake: status %d; want 200", st)
	}
	mu.Lock()
	defer mu.Unlock()
	want := "GET  done,GET 1 early,POST  done"
	if got := strings.Join(seen, ","); got != want {
		t.Fatalf("handler saw %q; want %q", got, want)
	}
}

// dialGated opens a QUIC connection with DialEarly. When gated, the client
// cannot read until the returned gate is released.
func dialGated(t *testing.T, addr string, tlsCfg *tls.Config, gated bool) (*quic.Conn, *gatedConn) {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gate := &gatedConn{PacketConn: pc, open: make(chan struct{})}
	if !gated {
		gate.release()
	}
	qtr := &quic.Transport{Conn: gate}
	t.Cleanup(func() { gate.release(); qtr.Close(); pc.Close() })
	raddr, _ := net.ResolveUDPAddr("udp", addr)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := qtr.DialEarly(ctx, raddr, tlsCfg, &quic.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return conn, gate
}

// sendEarly sends a bodiless request on its own stream at once (without
// waiting for the handshake) and delivers the response status.
func sendEarly(t *testing.T, cc *http3.ClientConn, method, url string) <-chan int {
	t.Helper()
	out := make(chan int, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	str, err := cc.OpenRequestStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if method == http3.MethodGet0RTT {
		method = http.MethodGet
	}
	req, _ := http.NewRequestWithContext(ctx, method, url, nil)
	if err := str.SendRequestHeader(req); err != nil {
		t.Fatal(err)
	}
	str.Close()
	go func() {
		resp, err := str.ReadResponse()
		if err != nil {
			out <- -1
			return
		}
		io.ReadAll(resp.Body)
		out <- resp.StatusCode
	}()
	return out
}

// Without allow_0rtt (the default) a resuming client's early data is
// refused: the connection does not use 0-RTT.
func TestHTTP3ZeroRTTOffByDefault(t *testing.T) {
	srv := &listen.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}),
		HTTPSAddr: "127.0.0.1:0", TLSConfig: testTLSConfig(t)}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	defer srv.Close()
	addr := srv.Addr(listen.ListenerHTTP3)
	tlsCfg := &tls.Config{InsecureSkipVerify: true, ClientSessionCache: tls.NewLRUClientSessionCache(4), NextProtos: []string{http3.NextProtoH3}}
	getTicket(t, addr, tlsCfg)
	conn, _ := dialGated(t, addr, tlsCfg, false)
	select {
	case <-conn.HandshakeComplete():
	case <-time.After(5 * time.Second):
		t.Fatal("no handshake")
	}
	if cs := conn.ConnectionState(); cs.Used0RTT || !cs.TLS.DidResume {
		t.Fatalf("Used0RTT %v, resumed %v; want a resumed connection without 0-RTT", cs.Used0RTT, cs.TLS.DidResume)
	}
}

// getTicket makes one request over a full handshake and waits until
// tlsCfg's session cache holds a ticket for addr.
func getTicket(t *testing.T, addr string, tlsCfg *tls.Config) {
	t.Helper()
	cache := &ticketCache{ClientSessionCache: tlsCfg.ClientSessionCache, stored: make(chan struct{})}
	cfg := tlsCfg.Clone()
	cfg.ClientSessionCache = cache
	tr := &http3.Transport{TLSClientConfig: cfg}
	defer tr.Close()
	resp, err := (&http.Client{Transport: tr}).Get("https://" + addr + "/first")
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	select { // the ticket follows the handshake
	case <-cache.stored:
	case <-time.After(5 * time.Second):
		t.Fatal("no session ticket stored 5s after the first request")
	}
}

// ticketCache is a client session cache that closes stored when the first
// session (ticket) is put into it.
type ticketCache struct {
	tls.ClientSessionCache
	stored chan struct{}
	once   sync.Once
}

func (c *ticketCache) Put(key string, cs *tls.ClientSessionState) {
	c.ClientSessionCache.Put(key, cs)
	if cs != nil { // nil removes an entry
		c.once.Do(func() { close(c.stored) })
	}
}
