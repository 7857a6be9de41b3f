package h1up

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// prober checks an idle connection's liveness with one non-blocking
// recv(MSG_PEEK): made once per connection, so the check allocates
// nothing.
type prober struct {
	rc   syscall.RawConn
	fn   func(fd uintptr) bool
	live bool
	buf  [1]byte
}

func (c *conn) initProbe() {
	sc, ok := c.nc.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	p := &prober{rc: rc}
	p.fn = p.peek
	c.probe = p
}

// peek runs on the socket's descriptor: the connection is live when there
// is nothing to read (EAGAIN); data nobody asked for or EOF mean it is
// not.
func (p *prober) peek(fd uintptr) bool {
	_, _, errno := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&p.buf[0])), 1,
		unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	p.live = errno == unix.EAGAIN || errno == unix.EWOULDBLOCK
	return true // never wait for readiness
}

// alive reports whether an idle connection can carry a request: the peer
// has not closed it and sent nothing unasked. A connection that is not a
// syscall.Conn is assumed alive.
func (c *conn) alive() bool {
	p := c.probe
	if p == nil {
		return true
	}
	p.live = false
	return p.rc.Read(p.fn) == nil && p.live
}
