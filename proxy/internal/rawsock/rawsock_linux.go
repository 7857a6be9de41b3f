package rawsock

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// maxRW bounds one read(2) or write(2), as internal/poll does on streams.
const maxRW = 1 << 30

// Conn is one connection's socket, read and written raw. Its read and
// write states are separate, so one reader and one writer may run at
// once (as on a net.Conn); concurrent reads (or writes) are not allowed.
// It allocates nothing per call: its callbacks are method values bound
// once, and the buffer and result of a call live in the Conn.
type Conn struct {
	nc net.Conn        // the connection: error addresses, and reads while Pending
	rc syscall.RawConn // nc's socket

	// Pending, when set, reports whether nc still has bytes of its own
	// to return before the socket's (a wrapper that read ahead, such as a
	// PROXY header's reader): Read goes through nc while it does, and
	// forgets Pending once it does not.
	Pending func() bool

	rp     []byte
	rn     int
	rerrno syscall.Errno
	readFn func(fd uintptr) bool

	wp      []byte
	wn      int
	werrno  syscall.Errno
	writeFn func(fd uintptr) bool
}

// New returns nc's socket as a Conn, or nil when raw calls are off or nc
// has no socket (rc nil). rc must be nc's own socket (or the socket of
// the connection nc wraps, when nc's Read and Write pass through to it).
func New(nc net.Conn, rc syscall.RawConn) *Conn {
	if !On || rc == nil {
		return nil
	}
	c := &Conn{nc: nc, rc: rc}
	c.readFn, c.writeFn = c.read, c.write
	return c
}

// Of returns a Conn for a *net.TCPConn (nil for any other net.Conn, or
// when raw calls are off).
func Of(nc net.Conn) *Conn {
	tc, ok := nc.(*net.TCPConn)
	if !ok || !On {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	return New(nc, rc)
}

// read is the RawConn.Read callback: false (wait until readable) on EAGAIN.
func (c *Conn) read(fd uintptr) bool {
	for {
		n, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&c.rp[0])), uintptr(len(c.rp)))
		switch e {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		case 0:
			c.rn = int(n)
		}
		c.rerrno = e
		return true
	}
}

// Read is net.Conn's Read: io.EOF when the peer closed, a *net.OpError
// (Op "read") for a failed call, a deadline or a closed connection.
func (c *Conn) Read(p []byte) (int, error) {
	if c.Pending != nil {
		if c.Pending() {
			return c.nc.Read(p)
		}
		c.Pending = nil
	}
	if len(p) == 0 {
		return 0, nil
	}
	if len(p) > maxRW {
		p = p[:maxRW]
	}
	c.rp, c.rn, c.rerrno = p, 0, 0
	err := c.rc.Read(c.readFn)
	n, e := c.rn, c.rerrno
	c.rp = nil
	switch {
	case err != nil:
		return 0, c.opError("read", err)
	case e != 0:
		return 0, c.opError("read", os.NewSyscallError("read", e))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// write is the RawConn.Write callback: it writes until all of c.wp went
// out, false (wait until writable) on EAGAIN.
func (c *Conn) write(fd uintptr) bool {
	for c.wn < len(c.wp) {
		b := c.wp[c.wn:]
		if len(b) > maxRW {
			b = b[:maxRW]
		}
		n, _, e := unix.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		switch e {
		case 0:
			if n == 0 {
				c.werrno = unix.EIO // a stream socket never takes 0 of >0 bytes
				return true
			}
			c.wn += int(n)
		case unix.EINTR:
		case unix.EAGAIN:
			return false
		default:
			c.werrno = e
			return true
		}
	}
	return true
}

// Write is net.Conn's Write: all of p, or the bytes written before an
// error (a *net.OpError, Op "write").
func (c *Conn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.wp, c.wn, c.werrno = p, 0, 0
	err := c.rc.Write(c.writeFn)
	n, e := c.wn, c.werrno
	c.wp = nil
	switch {
	case err != nil:
		return n, c.opError("write", err)
	case e != 0:
		return n, c.opError("write", os.NewSyscallError("write", e))
	}
	return n, nil
}

// opError is err as net.Conn's Read or Write reports it. The RawConn's
// own errors (a deadline, net.ErrClosed) come as a *net.OpError of op
// "raw-read" or "raw-write": renamed.
func (c *Conn) opError(op string, err error) error {
	if oe, ok := errors.AsType[*net.OpError](err); ok {
		oe.Op = op
		return oe
	}
	return &net.OpError{Op: op, Net: c.nc.LocalAddr().Network(), Source: c.nc.LocalAddr(), Addr: c.nc.RemoteAddr(), Err: err}
}

// WriteFD is write(2) of p on fd, a non-blocking socket, through
// RawSyscall when raw calls are on (else syscall.Write): for callers that
// hold a descriptor inside a RawConn callback (the hand-off's first
// write, proxy/handoff.go). EAGAIN and EINTR come back as errors; the
// caller decides.
func WriteFD(fd uintptr, p []byte) (int, error) {
	if !On {
		return syscall.Write(int(fd), p)
	}
	var ptr unsafe.Pointer
	if len(p) > 0 {
		ptr = unsafe.Pointer(&p[0])
	}
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(ptr), uintptr(len(p)))
	if e != 0 {
		return -1, e
	}
	return int(n), nil
}
