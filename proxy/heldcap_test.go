package proxy_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/proxy/listen"
)

// TestLoopStreamsCountAgainstConnCap: a connection whose stream went to an
// event loop (hijacked, its socket dup'ed and the net.Conn closed) still
// counts against its client address's connection cap until the loop closes
// it. A client at its cap with streams on the loops cannot open one more
// connection; once the streams end, it can.
func TestLoopStreamsCountAgainstConnCap(t *testing.T) {
	const maxConns = 2
	backend := httptest.NewServer(http.HandlerFunc(holdBackend)) // one event, then held
	t.Cleanup(backend.Close)
	e := loopEdge(t, backend.URL, edgeOpts{server: func(s *listen.Server) { s.MaxConnsPerAddr = maxConns }})
	var held []*http.Response
	for range maxConns {
		resp := post(t, &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}, e.http+"/v1/chat/completions", chatBody(""))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "data: {") {
			t.Fatalf("first event: %q %v", line, err)
		}
		held = append(held, resp)
	}
	onLoop(t, e, maxConns)

	// One more connection from the same address: refused (closed before
	// any byte is read), so no answer comes.
	if got := rawRequest(t, e.http); got != "" {
		t.Fatalf("a connection past the cap (%d streams on the loops) was served: %q", maxConns, got)
	}

	for _, resp := range held {
		resp.Body.Close() // the client leaves: the loop closes its socket
	}
	onLoop(t, e, 0)
	// The count drops when the loop has closed the socket (Relay.Closed,
	// just after the stream left the loop's count).
	waitFor(t, 5*time.Second, "a connection accepted once the streams ended", func() bool {
		return strings.HasPrefix(rawRequest(t, e.http), "HTTP/1.1 ")
	})
}

// rawRequest sends a request for /v1/models on a new connection to base
// and returns what came back within 2s ("" when the connection was closed
// without an answer).
func rawRequest(t *testing.T, base string) string {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	io.WriteString(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+testKey+"\r\nConnection: close\r\n\r\n")
	b, _ := io.ReadAll(c) // EOF or a reset when refused
	return string(b)
}
