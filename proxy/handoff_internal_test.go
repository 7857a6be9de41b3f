package proxy

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// tcpPair is a connected loopback TCP pair: c (the server's side) and p
// (the peer).
func tcpPair(t *testing.T) (c, p net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err = ln.Accept()
	if err != nil {
		p.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); p.Close() })
	return c, p
}

// TestWriteNow: the hand-off's early write of the head and first token
// writes what the socket takes at once, never waits for writability, and
// leaves the rest (or everything, when there is no socket or it is
// closed) to the loop.
func TestWriteNow(t *testing.T) {
	t.Run("all", func(t *testing.T) {
		c, p := tcpPair(t)
		msg := []byte("HTTP/1.1 200 OK\r\n\r\n5\r\nhello\r\n")
		if n := writeNow(c, msg); n != len(msg) {
			t.Fatalf("wrote %d of %d", n, len(msg))
		}
		got := make([]byte, len(msg))
		p.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(p, got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("peer read %q %v", got, err)
		}
	})
	t.Run("full socket: part, no wait", func(t *testing.T) {
		c, _ := tcpPair(t)
		c.(*net.TCPConn).SetWriteBuffer(4 << 10)
		big := make([]byte, 64<<20) // far more than the peer, who reads nothing, can buffer
		done := make(chan int, 1)
		go func() { done <- writeNow(c, big) }()
		select {
		case n := <-done:
			if n <= 0 || n >= len(big) {
				t.Fatalf("wrote %d of %d, want a part", n, len(big))
			}
		case <-time.After(10 * time.Second):
			t.Fatal("writeNow waited for the socket")
		}
	})
	t.Run("no socket", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		if n := writeNow(a, []byte("x")); n != 0 {
			t.Fatalf("wrote %d on a pipe", n)
		}
	})
	t.Run("closed", func(t *testing.T) {
		c, _ := tcpPair(t)
		c.Close()
		if n := writeNow(c, []byte("x")); n != 0 {
			t.Fatalf("wrote %d on a closed connection", n)
		}
	})
}
