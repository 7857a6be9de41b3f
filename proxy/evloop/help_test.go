package evloop

import (
	"bufio"
	"errors"
	"net/http/httputil"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-proxy/sluice/internal/chunked"
)

// TestHelpServesLoops: with the loops' goroutines not running (as when
// every P is busy and the scheduler does not poll the network), Help on
// another goroutine takes a new stream, relays each event and ends the
// stream, and takes the stop command; the loops' goroutines started after
// it see the stop and exit.
func TestHelpServesLoops(t *testing.T) {
	g, err := build(Options{Loops: 2})
	if err != nil {
		t.Fatal(err)
	}
	// helpAfter since each loop's last poll: a loop is helped only then.
	help := func() {
		time.Sleep(time.Duration(helpAfter) + time.Millisecond)
		g.Help()
	}
	up, cl, r, _ := handleOn(t, g, Stream{Idle: 5 * time.Second}, nil)
	help() // takes the stream (the add command)
	if g.Streams() != 1 {
		t.Fatalf("%d streams; want 1", g.Streams())
	}
	help() // the wake-up the first left for the loop's goroutine (none runs here)
	cr := httputil.NewChunkedReader(bufio.NewReader(cl))
	buf := make([]byte, 256)
	for i := range 3 {
		up.Write(chunked.AppendChunk(nil, []byte(ev(i))))
		waitPollable(t, g) // the backend's bytes are in
		help()
		cl.SetReadDeadline(time.Now().Add(time.Second))
		n, err := cr.Read(buf)
		if err != nil || string(buf[:n]) != ev(i) {
			t.Fatalf("event %d: %q, %v", i, buf[:n], err)
		}
	}
	// Polled just now: a second Help within helpAfter leaves the loop
	// to its goroutine. The poll is stamped an hour ahead, so that this
	// goroutine's being descheduled for more than helpAfter (200 µs)
	// between the stamp and Help's clock read, which a loaded machine
	// may do, does not make the poll look old (a 1 ms sleep there made
	// the test fail).
	up.Write(chunked.AppendChunk(nil, []byte(ev(3))))
	waitPollable(t, g)
	for _, l := range g.loops {
		l.polled.Store(mono() + int64(time.Hour))
	}
	g.Help()
	cl.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if n, err := cr.Read(buf); err == nil {
		t.Fatalf("Help within helpAfter relayed %q", buf[:n])
	}
	for _, l := range g.loops {
		l.polled.Store(mono()) // help() below waits helpAfter from here
		l.stop()
	}
	help() // the stop: the stream ends with ErrClosed
	select {
	case res := <-r.closed:
		if !errors.Is(res.err, ErrClosed) {
			t.Fatalf("closed with %v; want ErrClosed", res.err)
		}
	default:
		t.Fatal("stream not closed by the helped stop")
	}
	for _, l := range g.loops {
		if !l.exited {
			t.Fatal("loop not marked exited")
		}
		g.wg.Add(1)
		go l.run()
	}
	done := make(chan struct{})
	go func() { g.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("loops did not exit after a helper took their stop")
	}
	if g.Streams() != 0 {
		t.Fatalf("%d streams left", g.Streams())
	}
}

// TestHelpOff: with NoHelp, Help leaves a loop's ready streams alone.
func TestHelpOff(t *testing.T) {
	for _, o := range []Options{{Loops: 1, NoHelp: true}} {
		g, err := build(o)
		if err != nil {
			t.Fatal(err)
		}
		_, _, _, _ = handleOn(t, g, Stream{Idle: 5 * time.Second}, nil)
		time.Sleep(time.Duration(helpAfter) + time.Millisecond)
		g.Help()
		if n := len(g.loops[0].all); n != 0 {
			t.Fatalf("%+v: Help took the stream (%d)", o, n)
		}
		g.wg.Add(1)
		go g.loops[0].run()
		g.Close()
	}
}

// waitPollable waits until one of g's loops has an event ready for its
// epoll_wait (its epoll descriptor is readable): bytes written on a
// loopback socket usually are by the time the write returns, but not when
// the kernel leaves the receive side to ksoftirqd, which a loaded machine
// may run late.
func waitPollable(t *testing.T, g *Group) {
	t.Helper()
	fds := make([]unix.PollFd, len(g.loops))
	for i, l := range g.loops {
		fds[i] = unix.PollFd{Fd: int32(l.epfd), Events: unix.POLLIN}
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		n, err := unix.Poll(fds, 100)
		if n > 0 {
			return
		}
		if err != nil && err != unix.EINTR {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("no loop had an event ready within 5s")
		}
	}
}
