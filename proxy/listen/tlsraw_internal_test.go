package listen

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/tls/certs"
)

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
