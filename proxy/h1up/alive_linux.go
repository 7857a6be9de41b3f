package h1up

import (
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sluice-proxy/sluice/proxy/internal/rawsock"
)

// prober checks an idle connection's liveness with one non-blocking
// recv(MSG_PEEK), and sends a whole request and waits for its answer in
// one syscall.RawConn.Read (sendWait): made once per connection, so
// neither allocates. Its calls never block (MSG_DONTWAIT, a non-blocking
// socket) and go through RawSyscall, as the connection's reads and writes
// do (proxy/internal/rawsock: no entersyscall, so no sysmon wake-up).
type prober struct {
	rc   syscall.RawConn
	fn   func(fd uintptr) bool
	live bool
	buf  [1]byte

	// sendWait's state, for one call.
	send   func(fd uintptr) bool // p.sendThenWait
	raw    bool                  // nc is a *net.TCPConn: a raw write(2) bypasses nothing
	out    []byte                // the request
	sent   int                   // bytes of out written
	werr   error                 // the write's error (not EAGAIN)
	reused bool                  // the connection served a request before
	ran    bool                  // sendThenWait ran (the request was tried)
	dead   bool                  // reused, and the peek found EOF, an error or unasked bytes
}

func (c *conn) initProbe() {
	c.rs = rawsock.Of(c.nc)
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
	p.send = p.sendThenWait
	_, p.raw = c.nc.(*net.TCPConn)
	c.probe = p
}

// peek runs on the socket's descriptor: the connection is live when there
// is nothing to read (EAGAIN); data nobody asked for or EOF mean it is
// not.
func (p *prober) peek(fd uintptr) bool {
	_, _, errno := unix.RawSyscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&p.buf[0])), 1,
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

// sendWaitOn is SLUICE_H1UP_SENDWAIT=1, read once: off by default (it
// cut a read per small request but was not measured better in `sluice
// serve`, and target 1's TTFT came out higher in 10 of 15 rounds:
// docs/BENCHMARKS.md "small8sys"); off, every request goes through the
// net.Conn after getConn's liveness check, as before.
var sendWaitOn = os.Getenv("SLUICE_H1UP_SENDWAIT") == "1"

// canSendWait reports whether sendWait works on c.
func (c *conn) canSendWait() bool { return sendWaitOn && c.probe != nil && c.probe.raw }

// sendWait writes out (a whole request) on c and waits until the socket
// turns readable, saving the read that would meet EAGAIN before the
// answer is there. It runs as one syscall.RawConn.Read, whose
// internal/poll.FD.RawRead resets the descriptor's read readiness
// (prepareRead → runtime_pollReset) before it calls sendThenWait, and
// parks (waitRead) only when that returns false: an answer arriving after
// the write sets the readiness the park then finds, so none is lost.
// Bytes or EOF that arrived before the reset would give no new edge:
// sendThenWait therefore peeks first, and on a reused connection that
// finds anything it writes nothing and reports dead (the liveness check,
// now made right before the write); on a fresh one it writes and does not
// wait. n < len(out) with a nil error (EAGAIN, a partial write) leaves
// the rest to the caller, who then reads as usual. err is the RawConn's
// when nothing ran (the socket closed: a cancelled request).
func (c *conn) sendWait(out []byte) (n int, dead bool, err error) {
	p := c.probe
	p.out, p.sent, p.werr, p.reused, p.ran, p.dead = out, 0, nil, c.reused, false, false
	rerr := p.rc.Read(p.send)
	p.out = nil
	switch {
	case !p.ran:
		return 0, false, rerr
	case p.dead:
		return 0, true, nil
	}
	// A wait that ended in an error (the socket closed by a cancel) after
	// a whole write is the next read's to report.
	return p.sent, false, p.werr
}

// sendThenWait is sendWait's RawConn.Read callback: peek, write, and
// return false (wait for readiness) only when the peek found nothing and
// the whole request went out. Called again after the wait, it returns
// true: the response is read through the net.Conn.
func (p *prober) sendThenWait(fd uintptr) bool {
	if p.ran {
		return true
	}
	p.ran = true
	_, _, errno := unix.RawSyscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&p.buf[0])), 1,
		unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	quiet := errno == unix.EAGAIN || errno == unix.EWOULDBLOCK
	if !quiet && p.reused {
		p.dead = true
		return true
	}
	for {
		n, _, errno := unix.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p.out[0])), uintptr(len(p.out)))
		switch errno {
		case 0:
			p.sent = int(n)
			return !quiet || p.sent < len(p.out)
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return true // nothing sent: the caller writes through the conn
		}
		p.werr = os.NewSyscallError("write", errno)
		return true
	}
}
