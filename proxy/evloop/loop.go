package evloop

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-proxy/sluice/internal/chunked"
)

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }

// events is how many ready descriptors one epoll_wait returns at most.
const events = 256

// loop is one event loop: a goroutine waiting for its epoll descriptor
// (in Go's netpoller) and the streams it owns. Everything but mu's fields is touched by the loop's
// goroutine only.
type loop struct {
	g    *Group
	opts Options
	epfd int
	efd  int // eventfd: wakes the loop for commands
	byFD []*stream
	all  []*stream // for the idle sweep; stream.idx is its place
	// drains are finished streams whose backend body is still read to
	// its end for reuse (see finish); the sweep closes those past drainBy.
	drains []*stream
	// parks are the parked client sockets (park.go), parkFD the same by
	// descriptor.
	parks   []*parked
	parkFD  []*parked
	nparked atomic.Int64 // len(parks), for Group.Parked
	rbuf    []byte       // shared read buffer
	out     []byte       // shared out buffer
	sink    [512]byte    // client input is read here and dropped
	ready   []unix.EpollEvent
	woken   bool // the last dispatch ran the queued streams and commands
	touched int  // what touch read
	// kicks are the streams whose ClientSink was written in this batch:
	// each sink's Flush runs once at the batch's end (kickAll).
	kicks []*stream

	// own is held by whoever serves the loop: its goroutine, from its
	// epoll_wait to the end of that batch, or a helper (Group.Help).
	// Everything above is touched under it only.
	own    sync.Mutex
	exited bool         // under own: the loop stopped; its descriptors are closed
	polled atomic.Int64 // mono() of the last epoll_wait, by the loop or a helper

	mu       sync.Mutex
	cmds     []func()
	adds     []*stream
	stopping bool
	closed   bool // no more submits
	dead     bool // run returned after a failed wait: efd is closed
}

func newLoop(g *Group, opts Options) (*loop, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	unix.SetNonblock(epfd, true) // os.NewFile then puts it in the netpoller
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(epfd)
		return nil, err
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(efd)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, efd, &ev); err != nil {
		unix.Close(epfd)
		unix.Close(efd)
		return nil, err
	}
	l := &loop{g: g, opts: opts, epfd: epfd, efd: efd, rbuf: make([]byte, opts.ReadBuffer),
		out: make([]byte, 0, opts.ReadBuffer+opts.ReadBuffer/4), ready: make([]unix.EpollEvent, events)}
	return l, nil
}

var one = []byte{1, 0, 0, 0, 0, 0, 0, 0}

// wake makes epoll_wait return.
// (Raw: see raw.go; the eventfd never blocks.)
func (l *loop) wake() { rawWrite(l.efd, one) }

// submit queues a new stream for the loop; false when the loop is closed.
// The wake-up is written under mu, as stop's: written after mu was let go,
// it could follow a concurrent stop, the loop's exit and efd's close, and
// land in whatever descriptor took efd's number.
func (l *loop) submit(s *stream) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.adds = append(l.adds, s)
	l.wake()
	return true
}

// command runs f on the loop's goroutine (the wake-up under mu: see
// submit).
func (l *loop) command(f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.cmds = append(l.cmds, f)
	l.wake()
}

// stop makes the loop end its streams and return. The wake-up is written
// under mu: the loop closes efd only after it has read stopping (under
// mu) or after it died (dead, under mu), so the write never meets a
// closed (or reused) descriptor.
func (l *loop) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopping, l.closed = true, true
	if !l.dead {
		l.wake()
	}
}

// run is the loop's goroutine. It waits for its epoll descriptor in Go's
// own netpoller (the descriptor is readable when streams are ready) and
// collects the ready streams with a non-blocking epoll_wait: no thread
// stays blocked in a system call, so the runtime never has to hand the
// loop's P to another thread (as it must for a goroutine blocked in
// epoll_wait past sysmon's 20 µs), and a wake-up costs what any
// goroutine's does. (A loop blocking in epoll_wait on its own thread, one
// holding a P of its own, and one serving its batches inside the
// netpoller's read were measured and removed: docs/ARCHITECTURE.md,
// "Designs weighed and removed".)
func (l *loop) run() {
	defer l.g.wg.Done()
	defer unix.Close(l.efd)
	f := os.NewFile(uintptr(l.epfd), "evloop") // non-blocking: in the netpoller
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		panic("evloop: " + err.Error())
	}
	var deadline time.Time
	wait := func(timeout time.Duration) (int, error) {
		switch {
		case timeout < 0 && !deadline.IsZero():
			deadline = time.Time{}
			f.SetReadDeadline(deadline)
		case timeout >= 0 && (deadline.IsZero() || !time.Now().Before(deadline) || time.Until(deadline) > timeout):
			deadline = time.Now().Add(timeout)
			f.SetReadDeadline(deadline)
		}
		n, locked := 0, false
		var werr error
		rc.Read(func(fd uintptr) bool {
			// A helper may have served what woke us (Group.Help):
			// then there is nothing to take and we wait again.
			l.own.Lock()
			if l.exited {
				locked = true
				return true
			}
			n, werr = rawEpollWait(int(fd), l.ready)
			if werr == unix.EINTR || werr == unix.EAGAIN {
				werr = nil
			}
			l.polled.Store(mono())
			// (a helper added streams or drains: the sweep's deadline is due)
			if n > 0 || werr != nil || timeout < 0 && l.sweepEvery() >= 0 {
				locked = true
				return true
			}
			l.own.Unlock()
			return false
		})
		if !locked { // the deadline: the sweep's turn
			l.own.Lock()
		}
		if werr != nil {
			return 0, fmt.Errorf("evloop: epoll_wait: %w", werr)
		}
		return max(n, 0), nil
	}
	sweep := l.opts.Sweep
	lastSweep := time.Now()
	timeout := time.Duration(-1) // no streams yet
	for {
		n, err := wait(timeout)
		if l.exited { // a helper took the stop command
			l.own.Unlock()
			return
		}
		now := time.Now()
		if err != nil {
			l.fail(err, now)
			l.exited = true
			l.own.Unlock()
			return
		}
		if l.dispatch(n, now) {
			l.exited = true
			l.own.Unlock()
			return
		}
		if now.Sub(lastSweep) >= sweep {
			lastSweep = now
			l.sweep(now)
		}
		timeout = l.sweepEvery()
		l.own.Unlock()
	}
}

// dispatch serves the n ready events in l.ready, then the queued streams
// and commands; true when the loop stops. The caller holds own. The
// sinks written in the batch are flushed at its end, once each.
func (l *loop) dispatch(n int, now time.Time) bool {
	stop := l.dispatchBatch(n, now)
	l.kickAll()
	return stop
}

// kick queues s's sink for the batch's Flush.
func (l *loop) kick(s *stream) {
	if !s.kicked {
		s.kicked = true
		l.kicks = append(l.kicks, s)
	}
}

// kickAll flushes the sinks written since the last call: one Flush per
// stream, which wakes its connection's writer at most once per batch.
func (l *loop) kickAll() {
	for i, s := range l.kicks {
		s.kicked = false
		s.csink.Flush()
		l.kicks[i] = nil
	}
	l.kicks = l.kicks[:0]
}

func (l *loop) dispatchBatch(n int, now time.Time) bool {
	if n > 1 {
		l.touch(n)
	}
	woken := false
	for _, ev := range l.ready[:max(n, 0)] {
		fd := int(ev.Fd)
		if fd == l.efd {
			woken = true
			continue
		}
		if fd >= len(l.byFD) || l.byFD[fd] == nil {
			l.parkedReady(fd, ev.Events)
			continue
		}
		s := l.byFD[fd]
		if fd == s.cfd {
			l.clientReady(s, ev.Events, now)
		} else {
			if ev.Events&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
				s.upHup = true // read to EOF: no edge will come for it
			} else if ev.Events&unix.EPOLLIN == 0 {
				continue // nothing to read: no read(2) that meets EAGAIN
			}
			l.upstreamReady(s, now)
		}
	}
	// Commands after the batch: a descriptor a stream closed above may
	// be reused by a stream added here, and a stale event must not
	// reach it.
	l.woken = woken
	if woken {
		var buf [8]byte
		rawRead(l.efd, buf[:])
		return l.commands(now)
	}
	return false
}

// touch reads the per-event lines of the batch's streams (stream) before
// any is served: their cache misses then overlap, instead of each
// stalling its own event after the system calls of the events before it.
func (l *loop) touch(n int) {
	t := 0
	for _, ev := range l.ready[:n] {
		if fd := int(ev.Fd); fd < len(l.byFD) {
			if s := l.byFD[fd]; s != nil {
				t += s.ufd + int(s.sent) + len(s.pend)
				if s.keepIn {
					t++
				}
			}
		}
	}
	l.touched = t // (kept, so that the loads are not dropped)
}

// help serves l's ready streams on the calling goroutine (Group.Help)
// when nobody polled it for helpAfter and nobody serves it now.
func (l *loop) help(now int64) {
	if now-l.polled.Load() < helpAfter || !l.own.TryLock() {
		return
	}
	if !l.exited {
		// Without streams, drains or parked sockets the loop's goroutine
		// waits with no deadline, until its descriptor turns readable.
		asleep := l.sweepEvery() < 0
		n, _ := rawEpollWait(l.epfd, l.ready)
		l.polled.Store(mono())
		if n > 0 && l.dispatch(n, time.Now()) {
			l.exited = true // the loop's goroutine sees it when its wait returns
		} else if asleep && l.sweepEvery() >= 0 {
			// This helper took the wake-up of what it just started (an
			// Add's), and nothing of that may be ready soon (a ClientSink
			// stream whose backend is silent registers no writable
			// socket): wake the goroutine, so that it sets the sweep's
			// deadline, or idle timeouts would never end those streams.
			l.wake()
		}
	}
	l.own.Unlock()
}

// fail ends a loop whose wait failed (its epoll descriptor is unusable;
// err wraps the errno; the streams' error wraps ErrFailed too): no more streams are taken, the queued ones and
// commands are run, and every stream is ended with err and closed, as
// Close would with ErrClosed. Group.Err has err before the first stream
// ends. Group.Add then gives this loop's turns to
// the other loops (ErrClosed when none is left).
func (l *loop) fail(err error, now time.Time) {
	err = fmt.Errorf("%w: %w", ErrFailed, err)
	l.g.failed(err) // before the streams' ends: Err tells why they ended
	l.mu.Lock()
	l.closed, l.dead = true, true
	adds, cmds := l.adds, l.cmds
	l.adds, l.cmds = nil, nil
	l.mu.Unlock()
	l.runQueued(adds, cmds, now)
	l.endAll(err, true)
	l.closeDrains()
	l.kickAll()
	l.closeParked()
}

// runQueued starts the streams and runs the commands taken from the
// loop's queues (under mu, by commands or fail).
func (l *loop) runQueued(adds []*stream, cmds []func(), now time.Time) {
	for _, s := range adds {
		l.start(s, now)
	}
	for _, f := range cmds {
		f()
	}
}

// commands takes the queued streams and commands; true when the loop
// stops (after ending its streams).
func (l *loop) commands(now time.Time) bool {
	l.mu.Lock()
	adds, cmds, stopping := l.adds, l.cmds, l.stopping
	l.adds, l.cmds = nil, nil
	l.mu.Unlock()
	l.runQueued(adds, cmds, now)
	if stopping {
		l.endAll(ErrClosed, true)
		l.closeDrains()
		l.closeParked()
		return true
	}
	return false
}

// endAll ends every stream with err. With force (the loop stops) each is
// closed at once: its last bytes are written best effort, a held one is
// not waited for.
func (l *loop) endAll(err error, force bool) {
	all := append([]*stream(nil), l.all...)
	for _, s := range all {
		if !s.ending {
			l.end(s, err)
		}
		if force && !s.closed {
			l.finish(s)
		}
	}
}

// start registers a new stream's sockets and relays what it brought.
func (l *loop) start(s *stream, now time.Time) {
	s.last = now
	s.idx = len(l.all)
	l.all = append(l.all, s)
	if s.csink != nil {
		s.csink.Attach(&Handle{l: l, s: s})
	}
	for _, fd := range [2]int{s.cfd, s.ufd} {
		if fd < 0 {
			continue // a ClientSink's stream
		}
		for fd >= len(l.byFD) {
			l.byFD = append(l.byFD, nil)
		}
		l.byFD[fd] = s
		// The backend's socket is only read: without EPOLLOUT in its
		// interest an edge whose bytes an earlier read of the batch took
		// already is not reported at all (with it, it came back as
		// EPOLLOUT alone and cost a read that returned EAGAIN).
		evs := uint32(unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLET)
		if fd == s.cfd {
			evs |= unix.EPOLLOUT
		}
		ev := unix.EpollEvent{Events: evs, Fd: int32(fd)}
		if err := rawEpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			l.end(s, err)
			return
		}
	}
	if len(s.first) > 0 {
		first := s.first
		s.first = nil
		l.write(s, first) // into pend when cut short: s.pendp holds it
		if len(s.pend) == 0 {
			l.dropPend(s)
		}
		if s.closed {
			return
		}
	}
	init, raw := s.init, s.raw
	s.init, s.raw = nil, nil
	if len(init) > 0 || len(raw) > 0 {
		out, done, err := l.events(s, l.out[:0], init, now)
		if !done && err == nil && len(raw) > 0 {
			// raw belongs to the caller: decode a copy.
			p := append(l.rbuf[:0], raw...)
			out, done, err = l.feed(s, out, p, now)
		} else if done && len(raw) > 0 {
			s.upDirty = true // raw's framing was not decoded: the body's end is unknown
		}
		if l.settle(s, out, done, err) {
			return
		}
	}
	l.upstreamReady(s, now)
}

// clientReady handles the client's socket: gone, input or writable.
func (l *loop) clientReady(s *stream, evs uint32, now time.Time) {
	if evs&(unix.EPOLLERR|unix.EPOLLHUP|unix.EPOLLRDHUP) != 0 {
		l.gone(s)
		return
	}
	if evs&unix.EPOLLIN != 0 && !s.keepIn {
		// A request after ours (we answered Connection: close) is read
		// and dropped; EOF means the client left. (With keepIn it stays
		// in the socket for the next owner; EPOLLRDHUP tells the close.)
		for {
			n, err := rawRead(s.cfd, l.sink[:])
			if n == 0 && err == nil || err != nil && err != unix.EAGAIN && err != unix.EINTR {
				l.gone(s)
				return
			}
			if err == unix.EAGAIN {
				break
			}
		}
	}
	if evs&unix.EPOLLOUT != 0 && len(s.pend) > 0 {
		l.drained(s, now)
	}
}

// drained writes s's pending bytes and, once none is left, goes on: the
// tail's end, or the backend's reads (paused while the client was
// behind).
func (l *loop) drained(s *stream, now time.Time) {
	l.flush(s, now)
	if s.closed || len(s.pend) > 0 {
		return
	}
	if s.held {
		return
	}
	if s.ending {
		l.finish(s)
		return
	}
	l.upstreamReady(s, now) // it was not read while the client was behind
}

// resumeSink is Waker.Resume on the loop: the sink can take bytes again.
func (l *loop) resumeSink(s *stream, now time.Time) {
	if !s.closed && len(s.pend) > 0 {
		l.drained(s, now)
	}
}

// gone ends s because the client left.
func (l *loop) gone(s *stream) {
	if s.held {
		s.gone = true // Finish closes it
		l.dropPend(s)
		return
	}
	if s.ending {
		if s.csink != nil {
			s.gone = true // the sink's Close resets the stream
		}
		l.finish(s) // its last bytes are no longer wanted
		return
	}
	l.end(s, ErrClientGone)
}

// upstreamReady reads everything the backend sent (until EAGAIN, a short
// read, or the client falls behind), relaying each read in one write.
func (l *loop) upstreamReady(s *stream, now time.Time) {
	if s.ending {
		if s.draining {
			l.drainUp(s)
		}
		return
	}
	for !s.ending && len(s.pend) == 0 {
		n, err := rawRead(s.ufd, l.rbuf)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return
		}
		if n <= 0 {
			if err == nil {
				err = ErrUpstreamCut // EOF before the Relay's end
			}
			l.end(s, err)
			return
		}
		s.last = now
		out, done, ferr := l.feed(s, l.out[:0], l.rbuf[:n], now)
		// A short read took all that was there, and more data brings a new
		// edge; but an EOF that came with the data brings none: after
		// EPOLLRDHUP read on until it.
		if l.settle(s, out, done, ferr) || n < len(l.rbuf) && !s.upHup {
			return
		}
	}
}

// feed decodes p (bytes read from the backend, in l.rbuf) in place and
// relays the events in it.
func (l *loop) feed(s *stream, out, p []byte, now time.Time) ([]byte, bool, error) {
	var ended bool
	switch {
	case s.dec != nil:
		var err error
		var n int
		m := len(p)
		p, n, ended, err = s.dec.Decode(p[:0], p)
		if err != nil {
			return out, false, err
		}
		s.upDirty = s.upDirty || ended && n < m // bytes past the body
	case s.remaining >= 0:
		if int64(len(p)) >= s.remaining {
			s.upDirty = s.upDirty || int64(len(p)) > s.remaining
			p, ended = p[:s.remaining], true
		}
		s.remaining -= int64(len(p))
	}
	s.upEnded = s.upEnded || ended
	out, done, err := l.events(s, out, p, now)
	if !done && err == nil && ended {
		err = ErrUpstreamCut
	}
	return out, done, err
}

// settle writes out and ends the stream when done or err says so; true
// when the stream no longer reads its backend.
func (l *loop) settle(s *stream, out []byte, done bool, err error) bool {
	if done || err != nil {
		l.endWith(s, out, err)
		return true
	}
	l.out = out[:0]
	if len(out) > 0 {
		l.write(s, out)
	}
	return s.closed || len(s.pend) > 0
}

// end ends s with err (see endWith).
func (l *loop) end(s *stream, err error) { l.endWith(s, l.out[:0], err) }

// endWith ends s with err after out (events not yet written): the
// backend's socket closes at once (that cancels its request), the Relay's
// last bytes go to the client unless it is gone. A held stream stays, its
// client socket open, until its Handle's Finish.
func (l *loop) endWith(s *stream, out []byte, err error) {
	if s.ending {
		return
	}
	s.ending, s.why = true, err
	if s.ufd >= 0 {
		if err == nil && s.reuse != nil && !s.upHup && !s.upDirty && (s.dec != nil || s.remaining >= 0) {
			if s.upEnded {
				l.giveBack(s)
			} else {
				s.draining = true // read on to the body's end (upstreamReady)
				l.drainUp(s)
			}
		} else {
			l.closeUp(s)
		}
	}
	out, s.held = s.relay.End(out, err)
	l.out = out[:0]
	if err == ErrClientGone || err == ErrSlowClient {
		s.gone = true
		l.dropPend(s)
		if !s.held {
			l.finish(s)
		}
		return
	}
	l.write(s, out)
	if !s.closed && !s.held && len(s.pend) == 0 {
		l.finish(s)
	}
}

// closeUp closes the backend's socket.
func (l *loop) closeUp(s *stream) {
	if s.ufd >= 0 {
		l.unmap(s.ufd)
		s.closeUp()
	}
	s.draining = false
}

// closeUp closes the backend's socket (its net.Conn).
func (s *stream) closeUp() { closeSock(&s.uconn, &s.ufd) }

// closeClient closes the client's socket (its net.Conn).
func (s *stream) closeClient() { closeSock(&s.cconn, &s.cfd) }

// closeSock closes one of a stream's sockets, the net.Conn c whose
// descriptor is fd; both are cleared.
func closeSock(c *net.Conn, fd *int) {
	if *c != nil {
		(*c).Close()
		*c = nil
	}
	*fd = -1
}

// giveBack hands the backend's socket, its body read to the end, to the
// stream's Reuse (Stream.Reuse). It leaves the epoll set first: the
// registration belongs to the socket, not the descriptor, and would
// outlive the descriptor's close while Reuse keeps a copy.
func (l *loop) giveBack(s *stream) {
	fd := s.ufd
	if rawEpollCtl(l.epfd, unix.EPOLL_CTL_DEL, fd, nil) != nil {
		l.closeUp(s)
		return
	}
	l.unmap(fd)
	s.ufd, s.draining, s.uconn = -1, false, nil // Reuse has it now
	s.reuse(fd)
}

// drainUp reads the rest of a completed stream's backend body (after the
// Relay's done, say the chunked coding's last chunk that had not come
// yet) and drops it; at the body's clean end the socket is given back
// (giveBack). Bytes past the body, a decode error, EOF or a read error
// close it. It returns on EAGAIN: the next edge brings the rest.
func (l *loop) drainUp(s *stream) {
	for s.draining && s.ufd >= 0 {
		n, err := rawRead(s.ufd, l.rbuf)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return
		}
		if n <= 0 {
			l.closeUp(s)
			return
		}
		if s.dec != nil {
			_, k, ended, derr := s.dec.Decode(l.rbuf[:0], l.rbuf[:n])
			s.upEnded = ended
			s.upDirty = derr != nil || ended && k < n
		} else {
			s.upDirty = int64(n) > s.remaining
			s.remaining -= int64(n)
			s.upEnded = s.remaining == 0
		}
		switch {
		case s.upDirty || s.upHup:
			l.closeUp(s)
		case s.upEnded:
			l.giveBack(s)
		}
	}
}

// release ends a held stream: tail goes to the client (unless it is gone),
// then the client's socket closes.
func (l *loop) release(s *stream, tail []byte) {
	if s.closed || !s.held {
		return
	}
	s.held = false
	if !s.gone {
		l.write(s, tail)
	}
	if !s.closed && len(s.pend) == 0 {
		l.finish(s)
	}
}

// events splits p (decoded payload) into events, with the partial event
// carried from before, and hands each to the Relay. What is left of an
// event goes to s.carry.
func (l *loop) events(s *stream, out, p []byte, now time.Time) ([]byte, bool, error) {
	if s.carry != nil {
		if len(*s.carry)+len(p) > MaxEventBytes {
			return out, false, ErrEventTooLarge
		}
		*s.carry = append(*s.carry, p...)
		p = *s.carry
	}
	start, i := 0, 0
	for {
		j := bytes.IndexByte(p[i:], '\n')
		if j < 0 {
			break
		}
		end := i + j + 1
		if end-i == 1 || end-i == 2 && p[i] == '\r' { // a blank line ends the event
			if i > start {
				var done bool
				out, done = s.relay.Event(out, p[start:end], now)
				if done {
					return out, true, nil
				}
			}
			start = end // (a stray blank line between events is dropped)
		}
		i = end
	}
	rest := p[start:]
	switch {
	case len(rest) == 0:
		if s.carry != nil {
			putBuf(s.carry)
			s.carry = nil
		}
	case s.carry != nil:
		n := copy(*s.carry, rest)
		*s.carry = (*s.carry)[:n]
	default:
		if len(rest) > MaxEventBytes {
			return out, false, ErrEventTooLarge
		}
		s.carry = getBuf()
		*s.carry = append(*s.carry, rest...)
	}
	return out, false, nil
}

// write sends out to the client in one write(2); what the socket does not
// take waits in s.pend, and the backend is not read until it has gone.
func (l *loop) write(s *stream, out []byte) {
	if len(out) == 0 || s.closed {
		return
	}
	if len(s.pend) > 0 { // behind already: keep the order
		s.pend = append(s.pend, out...)
		l.checkPending(s)
		return
	}
	n, ok := l.clientWrite(s, out)
	if !ok {
		l.gone(s)
		return
	}
	s.sent += int64(n)
	if n < len(out) {
		if s.pendp == nil {
			s.pendp = getBuf()
		}
		s.pend = append((*s.pendp)[:0], out[n:]...)
		l.checkPending(s)
	}
}

// checkPending cuts a stream whose client is too far behind.
func (l *loop) checkPending(s *stream) {
	if len(s.pend) > l.opts.MaxPending {
		if s.held {
			s.gone = true
			l.dropPend(s)
			return
		}
		if s.ending {
			l.finish(s)
			return
		}
		l.end(s, ErrSlowClient)
	}
}

// clientWrite writes p to the client's socket (or gives it to its sink)
// without waiting; false when the client is gone.
func (l *loop) clientWrite(s *stream, p []byte) (int, bool) {
	if s.csink != nil {
		l.kick(s)
		n, err := s.csink.Write(p)
		return n, err == nil
	}
	n, err := rawWrite(s.cfd, p)
	for err == unix.EINTR {
		n, err = rawWrite(s.cfd, p)
	}
	if err != nil && err != unix.EAGAIN {
		return 0, false
	}
	return max(n, 0), true
}

// flush writes pending bytes.
func (l *loop) flush(s *stream, now time.Time) {
	n, ok := l.clientWrite(s, s.pend)
	if !ok {
		l.gone(s)
		return
	}
	if n > 0 {
		s.sent += int64(n)
		s.last = now
		rest := copy(s.pend, s.pend[n:])
		s.pend = s.pend[:rest]
	}
	if len(s.pend) == 0 {
		l.dropPend(s)
	}
}

func (l *loop) dropPend(s *stream) {
	if s.pendp != nil {
		if s.pend != nil {
			*s.pendp = s.pend[:0]
		}
		putBuf(s.pendp)
		s.pendp, s.pend = nil, nil
	}
}

// sweep ends the streams idle past their deadline.
func (l *loop) sweep(now time.Time) {
	for i := 0; i < len(l.all); {
		s := l.all[i]
		if s.idle > 0 && !s.held && now.Sub(s.last) >= s.idle {
			switch {
			case s.ending:
				l.finish(s) // its last bytes could not be delivered in time
			case len(s.pend) > 0:
				l.end(s, ErrSlowClient)
			default:
				l.end(s, ErrIdle)
			}
			if i < len(l.all) && l.all[i] != s {
				continue // s left; another took its place
			}
		}
		i++
	}
	if len(l.drains) > 0 {
		keep := l.drains[:0]
		for _, s := range l.drains {
			if s.ufd >= 0 && now.Before(s.drainBy) {
				keep = append(keep, s)
			} else {
				l.closeUp(s) // no-op when given back or closed already
			}
		}
		clear(l.drains[len(keep):])
		l.drains = keep
	}
	l.kickAll()
	if len(l.parks) > 0 {
		l.sweepParked(now)
	}
}

// closeDrains closes the backend sockets still drained (the loop stops).
func (l *loop) closeDrains() {
	for _, s := range l.drains {
		l.closeUp(s)
	}
	l.drains = nil
}

// drainGrace bounds how long a finished stream's backend socket is still
// read for its body's end (the last chunk a server such as net/http
// writes after the handler's [DONE]): it usually comes within a
// millisecond, but on a loaded machine the stream's client side may be
// finished first.
const drainGrace = time.Second

// finish closes s's sockets, removes it and reports it closed. A backend
// socket still read to its body's end for reuse (draining) stays in the
// loop, for drainGrace at most: drainUp gives it back or closes it, the
// sweep closes it when the end does not come.
func (l *loop) finish(s *stream) {
	if s.closed {
		return
	}
	s.closed = true
	if s.ufd >= 0 {
		if s.draining {
			s.drainBy = time.Now().Add(drainGrace)
			l.drains = append(l.drains, s)
		} else {
			l.unmap(s.ufd)
			s.closeUp()
		}
	}
	if s.csink != nil {
		// Bytes left undelivered (the loop stops) end it with a reset too.
		l.kick(s)
		s.csink.Close(s.gone || len(s.pend) > 0)
	} else {
		l.unmap(s.cfd)
		k, kept := s.relay.(Keeper)
		// A clean end may hand the client's socket over (out of the epoll set
		// first: it is keyed by the socket, not by this descriptor), or
		// leave it parked on the loop (park.go).
		kept = kept && s.why == nil && !s.gone && (l.park(s) ||
			rawEpollCtl(l.epfd, unix.EPOLL_CTL_DEL, s.cfd, nil) == nil && k.Keep(s.cfd))
		if !kept {
			if s.keepIn {
				l.dropInput(s.cfd)
			}
			s.closeClient()
		}
	}
	s.cfd, s.cconn = -1, nil
	last := l.all[len(l.all)-1]
	l.all[s.idx] = last
	last.idx = s.idx
	l.all[len(l.all)-1] = nil
	l.all = l.all[:len(l.all)-1]
	if s.carry != nil {
		putBuf(s.carry)
		s.carry = nil
	}
	l.dropPend(s)
	l.g.live.Add(-1)
	s.relay.Closed(s.why, s.sent)
}

// dropInput reads and drops what the client sent that nobody will read,
// so that the close that follows is a FIN, not a reset that could cut the
// response's last bytes in the client's receive buffer.
func (l *loop) dropInput(fd int) {
	for range 64 { // bounded: 32 KiB at most
		n, err := rawRead(fd, l.sink[:])
		if n <= 0 || err != nil && err != unix.EINTR {
			return
		}
	}
}

func (l *loop) unmap(fd int) {
	if fd >= 0 && fd < len(l.byFD) {
		l.byFD[fd] = nil
	}
}

// stream is one relayed stream's state in its loop. The fields read for
// every event come first, with the chunked decoder's state held in the
// stream itself (decv): a token's relay reaches a few cache lines of it
// instead of fields spread over the whole struct and a separate decoder
// (with 64 streams and the network stack's work between two of a stream's
// tokens they are seldom still cached: docs/BENCHMARKS.md, "h1cpu7").
type stream struct {
	cfd, ufd  int
	relay     Relay
	csink     ClientSink       // the client's side when it is no socket (Stream.Sink)
	dec       *chunked.Decoder // &decv for a chunked body; nil otherwise
	remaining int64
	carry     *[]byte // a partial event; nil when none
	pend      []byte  // bytes the client has not taken yet
	sent      int64
	last      time.Time // the last byte from the backend (or to a slow client)
	ending    bool      // the backend is closed; the last bytes may be pending
	held      bool      // ended, waiting for its Handle's Finish
	upHup     bool      // the backend's side reported EPOLLRDHUP/HUP/ERR
	gone      bool      // the client left (or was cut) while held
	closed    bool      // finished
	kicked    bool      // in loop.kicks
	upEnded   bool      // the backend's body reached its end (framing)
	upDirty   bool      // bytes past the body's end, or a decode error, seen
	draining  bool      // completed; the body's end is being read (drainUp)
	keepIn    bool      // Stream.KeepInput: the client's input is not read
	decv      chunked.Decoder
	pendp     *[]byte // holds pend's storage
	// cconn and uconn are the stream's connections (their own descriptors
	// are cfd and ufd), closed by their Close; nil once closed or given
	// back (and cconn for a Sink stream).
	cconn, uconn net.Conn
	idle         time.Duration
	drainBy      time.Time // a finished stream's drain ends by then (loop.drains)
	idx          int       // in loop.all
	init, raw    []byte    // until start
	first        []byte    // Stream.Out, in pendp, until start
	why          error     // the end's cause; nil for a completed stream
	reuse        func(fd int)
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 1<<10); return &b }}

const maxPooled = 64 << 10

func getBuf() *[]byte {
	b := bufPool.Get().(*[]byte)
	*b = (*b)[:0]
	return b
}

func putBuf(b *[]byte) {
	if cap(*b) <= maxPooled {
		bufPool.Put(b)
	}
}
