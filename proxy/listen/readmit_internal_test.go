package listen

import (
	"context"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestReadmitConnKeepsOneWrapper: a connection re-admitted again and
// again (one keep-alive client, stream after stream on the loops) keeps
// one keptConn over its socket, replays what it was given first, still
// carries bytes, and its retired predecessors' Close leaves the socket
// open.
func TestReadmitConnKeepsOneWrapper(t *testing.T) {
	rl, peer, c := acceptedPair(t)
	c.(*capConn).request()
	buf := make([]byte, 1)
	for i := range 3 {
		if !ReadmitConn(c, []byte{'a' + byte(i)}) {
			t.Fatalf("round %d: not re-admitted", i)
		}
		c.Close() // retired: must not close the socket
		next, err := rl.Accept()
		if err != nil {
			t.Fatal(err)
		}
		kc := next.(*capConn).Conn.(*keptConn)
		if _, nested := kc.Conn.(*keptConn); nested {
			t.Fatalf("round %d: a keptConn over a keptConn", i)
		}
		next.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(next, buf); err != nil || buf[0] != 'a'+byte(i) {
			t.Fatalf("round %d: replay %q %v", i, buf, err)
		}
		peer.Write([]byte{'0' + byte(i)})
		if _, err := io.ReadFull(next, buf); err != nil || buf[0] != '0'+byte(i) {
			t.Fatalf("round %d: socket read %q %v", i, buf, err)
		}
		next.(*capConn).request()
		c = next
	}
	c.Close()
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := peer.Read(buf); err != io.EOF {
		t.Fatalf("after the last Close: %v; want EOF", err)
	}
}

// TestEarlySocket: a request's context from a cleartext listener gives its
// socket (a write through it reaches the client) and says the connection
// may be re-admitted, until the listener drains; a context from no
// listener of this package gives nil.
func TestEarlySocket(t *testing.T) {
	if raw, keep := EarlySocket(context.Background()); raw != nil || keep {
		t.Fatalf("no connection: %v %v; want nil false", raw, keep)
	}
	rl, peer, c := acceptedPair(t)
	defer c.Close()
	ctx := ConnContext(context.Background(), c)
	raw, keep := EarlySocket(ctx)
	if raw == nil || !keep {
		t.Fatalf("cleartext connection: %v %v; want a socket and true", raw, keep)
	}
	var werr error
	if err := raw.Write(func(fd uintptr) bool {
		_, werr = syscall.Write(int(fd), []byte("early"))
		return true
	}); err != nil || werr != nil {
		t.Fatal(err, werr)
	}
	buf := make([]byte, 5)
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(peer, buf); err != nil || string(buf) != "early" {
		t.Fatalf("peer read %q %v", buf, err)
	}
	rl.drain()
	if raw, keep := EarlySocket(ctx); raw == nil || keep {
		t.Fatalf("draining: %v %v; want a socket and false", raw, keep)
	}
}

// acceptedPair listens on a re-admitting listener, dials it and accepts:
// the listener, the client's end and the server's connection (the
// listener and the client's end are closed when the test ends).
func acceptedPair(t *testing.T) (*readmitListener, net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rl := newReadmitListener(newCapListener(ln, 0, time.Minute))
	t.Cleanup(func() { rl.Close() })
	peer, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	c, err := rl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return rl, peer, c
}
