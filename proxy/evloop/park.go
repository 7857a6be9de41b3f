package evloop

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Parking: a kept client socket (see Keeper) that waits on its loop for
// the client's next request instead of going back to a goroutine of the
// HTTP server at once. The socket is registered already (edge-triggered,
// EPOLLIN|EPOLLRDHUP among its events), so parking it costs no epoll_ctl;
// when the next request's bytes arrive, the Parked's Wake takes it over
// (out of the epoll set first) and serves it on a goroutine it starts; a
// client that closes, a socket idle past its bound, a close asked for
// (Shutdown's drain) or the loop's stop close it on the loop. An idle
// kept connection then costs no goroutine, and the next request is read
// by the goroutine started for it, not by one woken from the netpoller
// after it was parked there.

// Parker is a Keeper that may leave the kept client socket on the loop.
// Park runs on the loop, after a clean end, instead of Keep, while the
// socket is still in the loop's epoll set, and only when nothing is
// waiting in the socket (no pipelined bytes, no EOF: those get Keep at
// once). A nil Parked means no: the loop then asks Keep as before. It
// must not block.
type Parker interface {
	Keeper
	Park(fd int) Parked
}

// Parked is a client socket left on a loop. Its methods run on the loop
// and must not block; after Wake or Close the loop forgets the socket.
type Parked interface {
	// Wake: the client sent bytes. The socket is out of the loop's epoll
	// set and the callee's.
	Wake()
	// Close: the client closed, the idle bound passed, a close was asked
	// for or the loop stops. The callee closes the socket (it is out of
	// the loop's epoll set).
	Close()
	// Idle is how long the socket may wait for its next request.
	Idle() time.Duration
	// SetCloser gives the Parked the function that asks the loop to close
	// it (from any goroutine; a no-op once the loop forgot the socket).
	SetCloser(func())
}

// parked is a parked socket's record in its loop.
type parked struct {
	fd  int
	p   Parked
	by  time.Time // the idle bound's deadline
	idx int       // in loop.parks; -1 once forgotten
}

// parkSweep is how often parked sockets' idle bounds are checked when no
// stream asks for the finer sweep.
const parkSweep = time.Second

// park leaves s's client socket on the loop when its Relay is a Parker
// that takes it; the caller (finish) then forgets s's descriptor as kept.
func (l *loop) park(s *stream) bool {
	pk, ok := s.relay.(Parker)
	if !ok || s.cconn == nil {
		return false
	}
	if peekable(s.cfd) {
		return false // bytes or EOF already there: no edge will come for them
	}
	p := pk.Park(s.cfd)
	if p == nil {
		return false
	}
	pc := &parked{fd: s.cfd, p: p, by: time.Now().Add(p.Idle()), idx: len(l.parks)}
	l.parks = append(l.parks, pc)
	for s.cfd >= len(l.parkFD) {
		l.parkFD = append(l.parkFD, nil)
	}
	l.parkFD[s.cfd] = pc
	l.nparked.Add(1)
	p.SetCloser(func() { l.command(func() { l.dropParked(pc) }) })
	return true
}

// peekable reports whether the socket has bytes to read or its EOF.
func peekable(fd int) bool {
	var b [1]byte
	for {
		n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), 1,
			unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
		if e == unix.EINTR {
			continue
		}
		_ = n
		return e != unix.EAGAIN // data, EOF, or an error the next owner sees
	}
}

// parkedReady handles an event of a parked socket; false when fd is not
// parked.
func (l *loop) parkedReady(fd int, evs uint32) bool {
	if fd >= len(l.parkFD) || l.parkFD[fd] == nil {
		return false
	}
	pc := l.parkFD[fd]
	switch {
	case evs&(unix.EPOLLERR|unix.EPOLLHUP) != 0:
		l.dropParked(pc)
	case evs&unix.EPOLLRDHUP != 0:
		if peekable(fd) && hasBytes(fd) {
			l.wakeParked(pc) // a request, then the client's FIN
		} else {
			l.dropParked(pc)
		}
	case evs&unix.EPOLLIN != 0:
		l.wakeParked(pc)
	} // EPOLLOUT alone: nothing to do
	return true
}

// hasBytes reports whether the socket has bytes to read (not only EOF).
func hasBytes(fd int) bool {
	var b [1]byte
	n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), 1,
		unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	return e == 0 && n > 0
}

// forget takes pc out of the loop (and its socket out of the epoll set);
// false when it was forgotten already.
func (l *loop) forget(pc *parked) bool {
	if pc.idx < 0 {
		return false
	}
	rawEpollCtl(l.epfd, unix.EPOLL_CTL_DEL, pc.fd, nil)
	l.parkFD[pc.fd] = nil
	last := l.parks[len(l.parks)-1]
	l.parks[pc.idx] = last
	last.idx = pc.idx
	l.parks[len(l.parks)-1] = nil
	l.parks = l.parks[:len(l.parks)-1]
	pc.idx = -1
	l.nparked.Add(-1)
	return true
}

func (l *loop) wakeParked(pc *parked) {
	if l.forget(pc) {
		pc.p.Wake()
	}
}

func (l *loop) dropParked(pc *parked) {
	if l.forget(pc) {
		pc.p.Close()
	}
}

// sweepParked closes the parked sockets idle past their bound.
func (l *loop) sweepParked(now time.Time) {
	for i := 0; i < len(l.parks); {
		pc := l.parks[i]
		if !now.Before(pc.by) {
			l.dropParked(pc) // the last one takes its place
			continue
		}
		i++
	}
}

// closeParked closes every parked socket (the loop stops).
func (l *loop) closeParked() {
	for len(l.parks) > 0 {
		l.dropParked(l.parks[len(l.parks)-1])
	}
}

// sweepEvery is the wait's timeout: the sweep's period while streams or
// drains exist, parkSweep while only parked sockets do, else none.
func (l *loop) sweepEvery() time.Duration {
	switch {
	case len(l.all) > 0 || len(l.drains) > 0:
		return l.opts.Sweep
	case len(l.parks) > 0:
		return max(parkSweep, l.opts.Sweep)
	}
	return -1
}

// Parked is the number of client sockets parked on g's loops.
func (g *Group) Parked() int64 {
	var n int64
	for _, l := range g.loops {
		n += l.nparked.Load()
	}
	return n
}
