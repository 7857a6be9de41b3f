package rawsock

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// pair returns the two ends of a loopback TCP connection: the accepted
// one (to be read and written raw) and the dialled one.
func pair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	d, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		d.Close()
		t.Fatal(r.err)
	}
	t.Cleanup(func() { r.c.Close(); d.Close() })
	return r.c.(*net.TCPConn), d.(*net.TCPConn)
}

func rawOf(t *testing.T, c net.Conn) *Conn {
	t.Helper()
	s := Of(c)
	if s == nil {
		t.Fatal("Of returned nil for a *net.TCPConn")
	}
	return s
}

func TestReadWriteBothWays(t *testing.T) {
	a, b := pair(t)
	s := rawOf(t, a)
	if _, err := b.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	n, err := s.Read(buf)
	if err != nil || string(buf[:n]) != "ping" {
		t.Fatalf("Read = %q, %v; want ping", buf[:n], err)
	}
	if n, err := s.Write([]byte("pong")); n != 4 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(b, buf[:4]); err != nil || string(buf[:4]) != "pong" {
		t.Fatalf("peer read %q, %v", buf[:4], err)
	}
	if n, err := s.Read(nil); n != 0 || err != nil {
		t.Fatalf("Read(nil) = %d, %v; want 0, nil", n, err)
	}
}

// TestReadDeadlineWhileParked: a read with nothing to read parks in the
// netpoller, and its deadline ends it with net.Conn's error.
func TestReadDeadlineWhileParked(t *testing.T) {
	a, _ := pair(t)
	s := rawOf(t, a)
	a.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	start := time.Now()
	n, err := s.Read(make([]byte, 8))
	if n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read = %d, %v; want a deadline error", n, err)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "read" {
		t.Fatalf("error %#v is not a read *net.OpError", err)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("error %v is not a timeout", err)
	}
	if d := time.Since(start); d < 40*time.Millisecond || d > 5*time.Second {
		t.Fatalf("the read returned after %v", d)
	}
	// A later deadline lets the next read wait for bytes again.
	a.SetReadDeadline(time.Now().Add(5 * time.Second))
	go func() {
		time.Sleep(20 * time.Millisecond)
		a.SetReadDeadline(time.Now()) // moved in while parked
	}()
	if _, err := s.Read(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read with the deadline moved in while parked = %v", err)
	}
}

// TestEOF: the peer's close reads as io.EOF, after the bytes it sent.
func TestEOF(t *testing.T) {
	a, b := pair(t)
	s := rawOf(t, a)
	b.Write([]byte("last"))
	b.Close()
	a.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(s)
	if err != nil || string(got) != "last" {
		t.Fatalf("ReadAll = %q, %v; want last, nil", got, err)
	}
	n, err := s.Read(make([]byte, 4))
	if n != 0 || err != io.EOF {
		t.Fatalf("Read after EOF = %d, %v; want 0, io.EOF", n, err)
	}
}

// TestClosed: Close ends a parked read, and calls after it report
// net.ErrClosed, as net.Conn's do.
func TestClosed(t *testing.T) {
	a, _ := pair(t)
	s := rawOf(t, a)
	done := make(chan error, 1)
	go func() {
		_, err := s.Read(make([]byte, 8))
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	a.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("parked Read after Close = %v; want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end the parked read")
	}
	if _, err := s.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close = %v; want net.ErrClosed", err)
	}
	if _, err := s.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Read after Close = %v; want net.ErrClosed", err)
	}
}

// pattern is n bytes that show a reordering or a lost stretch.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>9)
	}
	return b
}

// TestLargeWriteToSlowReader: one Write far larger than the socket's
// buffers goes out in partial writes, parking between them until the
// slow reader made room; every byte arrives, in order.
func TestLargeWriteToSlowReader(t *testing.T) {
	a, b := pair(t)
	a.SetWriteBuffer(16 << 10)
	b.SetReadBuffer(16 << 10)
	s := rawOf(t, a)
	want := pattern(4 << 20)
	got := make(chan []byte, 1)
	go func() {
		var out bytes.Buffer
		buf := make([]byte, 32<<10)
		b.SetReadDeadline(time.Now().Add(20 * time.Second))
		for reads := 0; out.Len() < len(want); reads++ {
			n, err := b.Read(buf)
			out.Write(buf[:n])
			if err != nil {
				break
			}
			if reads%16 == 0 {
				time.Sleep(time.Millisecond) // slow: the writer must wait
			}
		}
		got <- out.Bytes()
	}()
	a.SetWriteDeadline(time.Now().Add(20 * time.Second))
	n, err := s.Write(want)
	if n != len(want) || err != nil {
		t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(want))
	}
	if g := <-got; !bytes.Equal(g, want) {
		t.Fatalf("the reader got %d bytes, not the %d written in order", len(g), len(want))
	}
}

// TestWriteDeadlineWhileParked: a write the peer never makes room for
// ends at its deadline with the bytes written so far.
func TestWriteDeadlineWhileParked(t *testing.T) {
	a, b := pair(t)
	a.SetWriteBuffer(16 << 10)
	b.SetReadBuffer(16 << 10)
	s := rawOf(t, a)
	a.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	n, err := s.Write(make([]byte, 8<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Write = %d, %v; want a deadline error", n, err)
	}
	if n <= 0 || n >= 8<<20 {
		t.Fatalf("Write reported %d bytes written; want some, not all", n)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "write" {
		t.Fatalf("error %#v is not a write *net.OpError", err)
	}
}

// TestPeerClosesMidWrite: a peer that closes (resetting the connection)
// while a large write waits for room makes the write fail with the
// socket's error (EPIPE or ECONNRESET), not hang.
func TestPeerClosesMidWrite(t *testing.T) {
	a, b := pair(t)
	a.SetWriteBuffer(16 << 10)
	b.SetReadBuffer(16 << 10)
	s := rawOf(t, a)
	b.Write([]byte("unread")) // a's unread bytes: nothing; b's close with unread data resets
	go func() {
		time.Sleep(50 * time.Millisecond)
		b.SetLinger(0) // RST on close
		b.Close()
	}()
	a.SetWriteDeadline(time.Now().Add(10 * time.Second))
	var err error
	for range 100 { // the first write may fit what the socket takes before the reset
		if _, err = s.Write(make([]byte, 1<<20)); err != nil {
			break
		}
	}
	if !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("Write after the peer's reset = %v; want EPIPE or ECONNRESET", err)
	}
	var se *os.SyscallError
	if !errors.As(err, &se) || se.Syscall != "write" {
		t.Fatalf("error %#v carries no write *os.SyscallError", err)
	}
}

// TestNoAllocation: a read of ready bytes and a write that fits allocate
// nothing.
func TestNoAllocation(t *testing.T) {
	a, b := pair(t)
	s := rawOf(t, a)
	msg := []byte("0123456789")
	buf := make([]byte, 64)
	in := make([]byte, 64)
	b.SetDeadline(time.Now().Add(10 * time.Second))
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := b.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(s, buf[:len(msg)]); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(b, in[:len(msg)]); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per read and write; want 0", allocs)
	}
}

// TestPendingReadsThroughConn: while Pending reports bytes of the
// wrapper's own, reads go through the wrapper; then through the socket.
func TestPendingReadsThroughConn(t *testing.T) {
	a, b := pair(t)
	w := &prefixConn{Conn: a, prefix: []byte("head-")}
	rc, err := a.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	s := New(w, rc)
	s.Pending = func() bool { return len(w.prefix) > 0 }
	b.Write([]byte("tail"))
	b.Close()
	a.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(s)
	if err != nil || string(got) != "head-tail" {
		t.Fatalf("ReadAll = %q, %v; want head-tail", got, err)
	}
	if s.Pending != nil {
		t.Fatal("Pending kept after the prefix ran out")
	}
}

type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// TestOfOnlyTCP: no raw socket for a connection without one (net.Pipe),
// nor when the switch is off.
func TestOfOnlyTCP(t *testing.T) {
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	if Of(p1) != nil {
		t.Fatal("Of(net.Pipe) is not nil")
	}
	a, _ := pair(t)
	defer func(on bool) { On = on }(On)
	On = false
	if Of(a) != nil {
		t.Fatal("Of with raw sockets off is not nil")
	}
}

// TestWriteFD: the raw write delivers its bytes, allocates nothing, and
// reports a full socket as EAGAIN (never waits); the same holds with raw
// calls off (syscall.Write).
func TestWriteFD(t *testing.T) {
	for _, on := range []bool{true, false} {
		old := On
		On = on
		a, b := pair(t)
		rc, err := a.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		msg := []byte("data: {\"x\":1}\n\n")
		var n int
		var werr error
		var allocs float64
		rc.Write(func(fd uintptr) bool {
			n, werr = WriteFD(fd, msg)
			allocs = testing.AllocsPerRun(20, func() { WriteFD(fd, msg[:1]) })
			return true
		})
		got := make([]byte, len(msg)+20)
		b.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(b, got); err != nil || n != len(msg) || werr != nil {
			t.Fatalf("on=%v: wrote %d, %v; read %q, %v", on, n, werr, got, err)
		}
		if !bytes.Equal(got[:len(msg)], msg) || !bytes.Equal(got[len(msg):], bytes.Repeat(msg[:1], 20)) {
			t.Fatalf("on=%v: read %q", on, got)
		}
		if on && allocs != 0 {
			t.Fatalf("WriteFD allocates %.0f times per call", allocs)
		}
		// Fill the socket (the peer does not read): EAGAIN, at once.
		a.SetWriteBuffer(4096)
		b.SetReadBuffer(4096)
		big := make([]byte, 1<<16)
		var last error
		rc.Write(func(fd uintptr) bool {
			for range 1000 {
				if _, last = WriteFD(fd, big); last != nil {
					break
				}
			}
			return true
		})
		if !errors.Is(last, syscall.EAGAIN) {
			t.Fatalf("on=%v: a full socket's write returned %v; want EAGAIN", on, last)
		}
		a.Close()
		b.Close()
		On = old
	}
}
