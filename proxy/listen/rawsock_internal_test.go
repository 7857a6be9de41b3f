package listen

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/tls/certs"
)

// TestRawSockOfWrappers: a connection the package's listeners accepted
// (capConn over the socket), and one re-admitted with bytes read before
// (capConn over keptConn with a prefix) get a raw socket that returns the
// prefix first, then the socket's bytes; a connection with no socket
// under it (net.Pipe) gets none.
func TestRawSockOfWrappers(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("raw sockets are Linux's")
	}
	rl, peer, c := acceptedPair(t)
	s := rawSockOf(c)
	if s == nil {
		t.Fatal("no raw socket under an accepted capConn")
	}
	if s.Pending != nil {
		t.Fatal("Pending set without a prefix")
	}
	c.(*capConn).request()
	if !ReadmitConn(c, []byte("GET ")) {
		t.Fatal("not re-admitted")
	}
	c.Close() // retired: the socket stays open
	next, err := rl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	s = rawSockOf(next)
	if s == nil || s.Pending == nil {
		t.Fatalf("re-admitted conn: raw socket %v, want one with Pending", s)
	}
	peer.Write([]byte("/x"))
	next.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 6)
	if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "GET /x" {
		t.Fatalf("read %q, %v; want the prefix, then the socket's bytes", buf, err)
	}
	if n, err := s.Write([]byte("ok")); n != 2 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(peer, buf[:2]); err != nil || string(buf[:2]) != "ok" {
		t.Fatalf("peer read %q, %v", buf[:2], err)
	}
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	if rawSockOf(p1) != nil || rawSockOf(&capConn{Conn: p1}) != nil {
		t.Fatal("a raw socket for a net.Pipe")
	}
}

// TestH1ServerRawAndFallback: the own server answers a request on a TCP
// connection through its raw socket, and on a net.Pipe (no socket) through
// the net.Conn, the same bytes.
func TestH1ServerRawAndFallback(t *testing.T) {
	raw := make(chan bool, 4)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hr, ok := w.(*h1Response); ok {
			raw <- hr.c.sock != nil
		}
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, "echo:"+string(b)+strings.Repeat("z", 100<<10))
	})
	s := &Server{Handler: h, HTTPAddr: "127.0.0.1:0", HTTPServer: HTTPServerSluice}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	go s.Serve()
	defer s.Close()
	ask := func(t *testing.T, c net.Conn) {
		t.Helper()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		go io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil || string(b) != "echo:abc"+strings.Repeat("z", 100<<10) {
			t.Fatalf("body of %d bytes, %v", len(b), err)
		}
	}
	t.Run("tcp", func(t *testing.T) {
		cl, err := net.Dial("tcp", s.Addr(ListenerHTTP))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		ask(t, cl)
		if got := <-raw; got != (runtime.GOOS == "linux") {
			t.Fatalf("raw socket used: %v", got)
		}
	})
	t.Run("pipe", func(t *testing.T) {
		p1, p2 := net.Pipe()
		defer p1.Close()
		hs := s.newH1Server(h)
		defer hs.Close()
		hs.serveConn(p2)
		ask(t, p1)
		if <-raw {
			t.Fatal("a raw socket for a net.Pipe")
		}
	})
}

// TestTLSRecordsRawSocket: a connection the TLS listener hands on reads
// and writes its records through the raw socket under it (as the
// cleartext listener's do), and that path keeps net.Conn's behaviour: a
// MiB each way through partial writes and reads, a read deadline ends a
// wait with a timeout, the peer's close is io.EOF.
func TestTLSRecordsRawSocket(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("raw sockets are Linux's")
	}
	store, err := certs.New(certs.Config{DevCert: true}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tl := newTLSListener(newCapListener(ln, 0, time.Minute), store.TLSConfig(), 5*time.Second, slog.New(slog.DiscardHandler))
	defer tl.Close()
	client := make(chan *tls.Conn, 1)
	go func() {
		c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			t.Error(err)
			close(client)
			return
		}
		client <- c
	}()
	sc, err := tl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	cc := <-client
	if cc == nil {
		t.FailNow()
	}
	defer cc.Close()
	hc, ok := sc.(*tls.Conn).NetConn().(*handshakenConn)
	if !ok {
		t.Fatalf("the TLS connection's transport is %T, want *handshakenConn", sc.(*tls.Conn).NetConn())
	}
	if hc.sock == nil {
		t.Fatal("no raw socket under the TLS connection")
	}

	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB: more than one socket buffer
	done := make(chan error, 1)
	go func() { _, err := cc.Write(big); done <- err }()
	got := make([]byte, len(big))
	sc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(sc, got); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("server read: %v, equal %v", err, bytes.Equal(got, big))
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	go func() { _, err := sc.Write(big); done <- err }()
	cc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(cc, got); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("client read: %v, equal %v", err, bytes.Equal(got, big))
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	sc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, err = sc.Read(got[:1])
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v; want a timeout", err)
	}
	// A timed-out read leaves a tls.Conn unusable for reads; the close is
	// seen on a fresh read of the raw socket under it.
	cc.Close()
	sc.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	for {
		_, err = hc.Read(buf) // the client's close_notify, then the end
		if err != nil {
			break
		}
	}
	if err != io.EOF {
		t.Fatalf("after the peer's close: %v; want io.EOF", err)
	}
}

// TestH1RequestAfterStop: the own server's requests do not derive from the
// server's cancellable base (no registration with it per request: connBase
// is never cancelled), and a request that starts after the base was
// cancelled — its listener still accepting — gets a context that ended
// with the base's cause at once.
func TestH1RequestAfterStop(t *testing.T) {
	got := make(chan error, 1)
	s := &Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- context.Cause(r.Context())
	}), HTTPAddr: "127.0.0.1:0", HTTPServer: HTTPServerSluice}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	go s.Serve()
	defer s.Close()
	hs, _ := s.servers[0].(*h1Server)
	if hs == nil {
		t.Fatalf("the cleartext listener's server is a %T", s.servers[0])
	}
	if hs.connBase.Done() != nil {
		t.Fatal("the connections' context can be cancelled: every request would register with it")
	}
	s.stopBase(ErrDraining)
	for deadline := time.Now().Add(5 * time.Second); !hs.stopped.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("stopRequests did not run within 5s of the base's cancel")
		}
	}
	c, err := net.Dial("tcp", s.Addr(ListenerHTTP))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	select {
	case err := <-got:
		if !errors.Is(err, ErrDraining) {
			t.Fatalf("a request started after the stop has context cause %v; want ErrDraining", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the request was not served")
	}
}
