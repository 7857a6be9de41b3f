package listen

import (
	"io"
	"net"
	"testing"
	"time"
)

// TestReadmitConnKeepsOneWrapper: a connection re-admitted again and
// again (one keep-alive client, stream after stream on the loops) keeps
// one keptConn over its socket, replays what it was given first, still
// carries bytes, and its retired predecessors' Close leaves the socket
// open.
func TestReadmitConnKeepsOneWrapper(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rl := newReadmitListener(newCapListener(ln, 0, time.Minute))
	defer rl.Close()
	peer, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	c, err := rl.Accept()
	if err != nil {
		t.Fatal(err)
	}
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
