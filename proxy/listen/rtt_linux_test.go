package listen

import (
	"net"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sluice-proxy/sluice/proxy/internal/rawsock"
)

// TestTCPInfoRTTRaw: the raw getsockopt reads the RTT the kernel reports
// through unix.GetsockoptTCPInfo, on a loopback connection that carried
// traffic, and allocates nothing; a descriptor that is not a socket reads 0.
func TestTCPInfoRTTRaw(t *testing.T) {
	if !rawsock.On {
		t.Skip(rawsock.Env + "=0: the raw call is off")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	buf := make([]byte, 64)
	for range 20 { // data and its ACKs: the kernel's RTT estimate
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var raw, cooked uint32
	var allocs float64
	rc.Control(func(fd uintptr) {
		// The same smoothed estimate read both ways (a late ACK between
		// two reads may move it: then read again).
		for range 10 {
			info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
			if err != nil {
				t.Fatal(err)
			}
			cooked = info.Rtt
			if raw = tcpInfoRTT(fd); raw == cooked {
				break
			}
		}
		allocs = testing.AllocsPerRun(100, func() { tcpInfoRTT(fd) })
	})
	if raw == 0 || raw != cooked {
		t.Fatalf("raw RTT %d µs; unix.GetsockoptTCPInfo read %d: want the same, positive", raw, cooked)
	}
	if allocs != 0 {
		t.Fatalf("tcpInfoRTT allocates %.0f times per call", allocs)
	}
	if d := tcpRTT(rc); d.Microseconds() != int64(raw) {
		t.Fatalf("tcpRTT %v; want %d µs", d, raw)
	}
	// Not a socket: getsockopt fails (ENOTSOCK), the RTT reads 0.
	fds := make([]int, 2)
	if err := syscall.Pipe(fds); err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fds[0])
	defer syscall.Close(fds[1])
	if got := tcpInfoRTT(uintptr(fds[0])); got != 0 {
		t.Fatalf("RTT of a pipe %d; want 0", got)
	}
}
