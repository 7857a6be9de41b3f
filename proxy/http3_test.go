package proxy_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/sluice-proxy/sluice/proxy/listen"
)

// quic-go's HTTP/3 client streams a completion through Sluice; the events
// arrive as the backend makes them, not together at the end.
func TestHTTP3StreamsIncrementally(t *testing.T) {
	cfg := fastSim()
	cfg.StepBase = 20 * time.Millisecond
	_, simURL := startSim(t, cfg)
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	resp := post(t, h3Client(t), e.h3+"/v1/chat/completions", chatBody(""))
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Proto != "HTTP/3.0" {
		t.Fatalf("got %d %s; want 200 HTTP/3.0", resp.StatusCode, resp.Proto)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("Content-Type %q; want text/event-stream", ct)
	}
	events, done := readEvents(t, resp.Body)
	if !done || len(events) < 12 {
		t.Fatalf("got %d events, done=%v; want ≥12 and [DONE]", len(events), done)
	}
	// 12 tokens at ≥20 ms a step: buffering would deliver them together.
	if span := events[len(events)-1].at.Sub(events[0].at); span < 100*time.Millisecond {
		t.Fatalf("events arrived within %v; want them spread over the stream (≥100ms)", span)
	}
	gaps := 0
	for i := 1; i < len(events); i++ {
		if events[i].at.Sub(events[i-1].at) > 5*time.Millisecond {
			gaps++
		}
	}
	if gaps < len(events)/2 {
		t.Fatalf("only %d of %d events arrived separately", gaps, len(events))
	}
	waitFor(t, 2*time.Second, "the access log line", func() bool {
		return len(e.log.lines(`"msg":"request"`, `"proto":"h3"`, `"status":200`)) == 1
	})
}

// A client that cancels its request (QUIC stream reset) or closes its
// whole connection cancels the upstream request at once.
func TestHTTP3ClientGoneCancelsUpstream(t *testing.T) {
	cfg := fastSim()
	cfg.StepBase = 20 * time.Millisecond
	sim, simURL := startSim(t, cfg)
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	long := `{"model":"sim-small","stream":true,"max_tokens":1000,"messages":[{"role":"user","content":"long"}]}`
	for _, how := range []string{"reset-stream", "close-connection"} {
		t.Run(how, func(t *testing.T) {
			tr := &http3.Transport{TLSClientConfig: insecure()}
			defer tr.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp := postCtx(t, ctx, &http.Client{Transport: tr}, e.h3+"/v1/chat/completions", long)
			buf := make([]byte, 64)
			if _, err := resp.Body.Read(buf); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 2*time.Second, "the sequence to run", func() bool { return sim.Stats().Running == 1 })
			if how == "reset-stream" {
				cancel()
			} else {
				tr.Close()
			}
			waitFor(t, 2*time.Second, "the simulator's running count to drop", func() bool { return sim.Stats().Running == 0 })
			resp.Body.Close()
		})
	}
}

// TLS responses (HTTP/1.1 and HTTP/2) advertise HTTP/3 with the edge's own
// Alt-Svc; a backend's Alt-Svc never reaches the client, on any protocol.
func TestAltSvc(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Alt-Svc", `h3=":9999"; ma=60`)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"))
	}))
	defer backend.Close()
	e := startEdge(t, edgeOpts{pool: poolOf(backend.URL)})
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(e.h3, "https://"))
	want := `h3=":` + port + `"; ma=86400`
	cases := []struct {
		name, base, proto string
		client            *http.Client
		altSvc            string
	}{
		{"h1-tls", e.https, "HTTP/1.1", h1Client(), want},
		{"h2-tls", e.https, "HTTP/2.0", h2Client(), want},
		{"h1-cleartext", e.http, "HTTP/1.1", h1Client(), ""},
		{"h3", e.h3, "HTTP/3.0", h3Client(t), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, path := range []string{"/v1/chat/completions", "/nowhere"} { // relayed, and an edge error
				resp := post(t, tc.client, tc.base+path, chatBody(""))
				resp.Body.Close()
				if resp.Proto != tc.proto {
					t.Fatalf("%s: proto %s; want %s", path, resp.Proto, tc.proto)
				}
				if got := strings.Join(resp.Header.Values("Alt-Svc"), ", "); got != tc.altSvc {
					t.Fatalf("%s: Alt-Svc %q; want %q", path, got, tc.altSvc)
				}
			}
		})
	}
}

// A UDP port that is taken is a start-up error naming it, not a node that
// silently serves TCP only.
func TestHTTP3PortInUse(t *testing.T) {
	var busy net.PacketConn
	for i := 0; busy == nil; i++ { // a UDP port whose TCP twin is free
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil || i == 20 {
			t.Fatalf("no port free on both TCP and UDP: %v", err)
		}
		busy, _ = net.ListenPacket("udp", ln.Addr().String())
		ln.Close()
	}
	defer busy.Close()
	addr := busy.LocalAddr().String()
	srv := &listen.Server{Handler: http.NotFoundHandler(), HTTPSAddr: addr, TLSConfig: testTLSConfig(t)}
	err := srv.Listen()
	if err == nil {
		srv.Close()
		t.Fatal("Listen succeeded with the UDP port taken")
	}
	if !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), "udp "+addr) || !strings.Contains(err.Error(), "http3") {
		t.Fatalf("error %q; want one naming udp %s (http3) and address in use", err, addr)
	}
	// Nothing stays bound: the TCP port is free again.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the TCP port stayed bound after the failed Listen: %v", err)
	}
	ln.Close()
	// With HTTP/3 disabled the same address works on TCP alone.
	off := false
	srv = &listen.Server{Handler: http.NotFoundHandler(), HTTPSAddr: addr, TLSConfig: testTLSConfig(t),
		HTTP3: listen.HTTP3Config{Enabled: &off}}
	if err := srv.Listen(); err != nil {
		t.Fatalf("Listen with http3 disabled: %v", err)
	}
	srv.Close()
}

// Shutdown over HTTP/3 behaves as over TCP: GOAWAY, a short stream
// finishes, a long one ends with an error event once the drain timeout
// passes and its upstream request is cancelled.
func TestHTTP3ShutdownDrainsStreams(t *testing.T) {
	cfg := fastSim()
	cfg.StepBase = 20 * time.Millisecond
	sim, simURL := startSim(t, cfg)
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	client := h3Client(t)
	type result struct {
		events []sseEvent
		done   bool
	}
	stream := func(maxTokens string) <-chan result {
		resp := post(t, client, e.h3+"/v1/chat/completions",
			`{"model":"sim-small","stream":true,"max_tokens":`+maxTokens+`,"messages":[{"role":"user","content":"x"}]}`)
		out := make(chan result, 1)
		go func() {
			defer resp.Body.Close()
			ev, done := readEvents(t, resp.Body)
			out <- result{ev, done}
		}()
		return out
	}
	short := stream("10")  // ~0.2 s: finishes within the drain timeout
	long := stream("5000") // ~100 s: cannot finish
	waitFor(t, 2*time.Second, "both streams running", func() bool { return sim.Stats().Running == 2 })

	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	shutdownWithin(t, e.server, ctx, 5*time.Second)
	if s := <-short; !s.done {
		t.Fatal("the short stream did not finish with [DONE] during the drain")
	}
	l := <-long
	if l.done || len(l.events) == 0 {
		t.Fatalf("long stream: done=%v, %d events; want events then an error", l.done, len(l.events))
	}
	if last := l.events[len(l.events)-1]; last.name != "error" || !strings.Contains(last.data, "shutting_down") {
		t.Fatalf("long stream ended with %q %q; want an error event saying the node is shutting down", last.name, last.data)
	}
	waitFor(t, 2*time.Second, "upstream cancelled", func() bool { return sim.Stats().Running == 0 })
	// The UDP port is released.
	pc, err := net.ListenPacket("udp", strings.TrimPrefix(e.h3, "https://"))
	if err != nil {
		t.Fatalf("UDP port still bound after Shutdown: %v", err)
	}
	pc.Close()
}

// A client that keeps an idle QUIC connection open after GOAWAY does not
// hold up Shutdown until the drain timeout.
func TestHTTP3ShutdownWithIdleConnection(t *testing.T) {
	e := startEdge(t, edgeOpts{pool: poolOf(closedURL(t))})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// A bare QUIC connection speaking no HTTP/3: it never closes by itself.
	conn, err := quic.DialAddr(ctx, strings.TrimPrefix(e.h3, "https://"),
		&tls.Config{InsecureSkipVerify: true, NextProtos: []string{http3.NextProtoH3}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseWithError(0, "")
	// The server has taken the connection once its HTTP/3 control stream
	// (SETTINGS) arrives: it opens it right after accepting.
	if _, err := conn.AcceptUniStream(ctx); err != nil {
		t.Fatalf("no control stream from the server: %v", err)
	}
	drain, cancelDrain := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelDrain()
	shutdownWithin(t, e.server, drain, 10*time.Second)
	if drain.Err() != nil {
		t.Fatal("Shutdown returned only after the drain timeout with one idle connection; want it not to wait for it")
	}
	select {
	case <-conn.Context().Done():
	case <-time.After(2 * time.Second):
		t.Fatal("the idle connection was not closed by Shutdown")
	}
}
