package h1up

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// alive reports whether an idle connection can carry a request: the peer
// has not closed it and sent nothing unasked. One non-blocking
// recv(MSG_PEEK) tells; a connection that is not a syscall.Conn is
// assumed alive.
func alive(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	live := false
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, rerr := unix.Recvfrom(int(fd), buf[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		live = rerr == unix.EAGAIN || rerr == unix.EWOULDBLOCK // no data, no EOF
		return true                                            // never wait for readiness
	})
	return err == nil && live
}
