package listen_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/proxy/listen"
)

func startCapped(t *testing.T, max int, first time.Duration) string {
	t.Helper()
	s := &listen.Server{
		Handler:  http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		HTTPAddr: "127.0.0.1:0", MaxConnsPerAddr: max, FirstRequestTimeout: first, H2Server: testH2Server,
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	go s.Serve()
	t.Cleanup(func() { s.Close() })
	return s.Addr(listen.ListenerHTTP)
}

// closedWithin reports whether the server closes c within d (reading and
// discarding whatever it sends first).
func closedWithin(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	// EOF: closed by the server; a reset too (the client's bytes that
	// arrived after the close make the server's kernel answer RST). Only a
	// timeout means the connection was still open.
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// TestAttackIdleH2Connections: an unauthenticated client opens h2c
// connections, sends the preface and then only PINGs, never a request.
// net/http keeps such a connection for IdleTimeout (2m); the first-request
// timeout closes it. Fails on the old code: the connection outlived 3s.
func TestAttackIdleH2Connections(t *testing.T) {
	addr := startCapped(t, 0, 500*time.Millisecond)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	c.Write([]byte{0, 0, 0, 4, 0, 0, 0, 0, 0}) // SETTINGS, empty
	stop := make(chan struct{})
	defer close(stop)
	go func() { // PING every 100ms: traffic, but no request
		ping := []byte{0, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}
		for i := 0; i < 50; i++ {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := c.Write(ping); err != nil {
				return
			}
		}
	}()
	start := time.Now()
	if !closedWithin(c, 3*time.Second) {
		t.Fatalf("an h2 connection without a request was still open after %v (first request timeout 500ms)", time.Since(start))
	}
}

// TestAttackConnsPerAddr: one client address opening more connections than
// max_conns_per_addr gets the extra ones closed at once; the ones it holds
// still serve, and a closed one frees its place.
func TestAttackConnsPerAddr(t *testing.T) {
	addr := startCapped(t, 3, time.Minute)
	var held []net.Conn
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	extra, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	if !closedWithin(extra, 2*time.Second) {
		t.Fatal("a 4th connection from one address was kept (cap 3)")
	}
	fmt.Fprintf(held[0], "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	held[0].SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(held[0]), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("a held connection did not serve: %v %v", resp, err)
	}
	held[1].Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		c.Close()
		if err == nil && resp.StatusCode == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a closed connection did not free its place: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
