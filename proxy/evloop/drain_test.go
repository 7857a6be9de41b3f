package evloop

import (
	"io"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-proxy/sluice/internal/chunked"
)

// TestReuseAfterClientSideFinished: a stream done ([DONE]) before its
// backend's body ended finishes its client side at once; its backend
// socket is still read, and given to Reuse when the last chunk comes
// after that. When it does not come, the socket is closed after
// drainGrace (and not given).
func TestReuseAfterClientSideFinished(t *testing.T) {
	g := newGroup(t, Options{Loops: 1, Sweep: 10 * time.Millisecond})
	reused := make(chan int, 2)
	reuse := func(fd int) { reused <- fd }

	up, cl, r, _ := handleOn(t, g, Stream{Idle: time.Minute, Reuse: reuse}, nil)
	up.Write(chunked.AppendChunk(nil, []byte(ev(0)+"data: [DONE]\n\n")))
	if evs, err := readEvents(cl); err != nil || len(evs) != 2 {
		t.Fatalf("client: %q, %v", evs, err)
	}
	if res := r.wait(t); res.err != nil {
		t.Fatalf("closed with %v", res.err)
	}
	up.Write([]byte("0\r\n\r\n")) // the body's end, after the stream was closed
	select {
	case fd := <-reused: // the backend's own descriptor: handleOn's cleanup closes its net.Conn
		if _, err := unix.Write(fd, []byte("next")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 8)
		up.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := io.ReadFull(up, buf[:4]); err != nil || string(buf[:n]) != "next" {
			t.Fatalf("the reused descriptor is not the backend's socket: %q, %v", buf[:n], err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the backend's socket was not given to Reuse after its body's end")
	}

	up2, cl2, r2, _ := handleOn(t, g, Stream{Idle: time.Minute, Reuse: reuse}, nil)
	up2.Write(chunked.AppendChunk(nil, []byte(ev(1)+"data: [DONE]\n\n")))
	if evs, err := readEvents(cl2); err != nil || len(evs) != 2 {
		t.Fatalf("client: %q, %v", evs, err)
	}
	closedAt := time.Now()
	if res := r2.wait(t); res.err != nil {
		t.Fatalf("closed with %v", res.err)
	}
	up2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := up2.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("backend's read with its body never ended: %v; want EOF", err)
	}
	if d := time.Since(closedAt); d < drainGrace/2 {
		t.Fatalf("the backend's socket closed %v after the stream; want it drained for about %v", d, drainGrace)
	}
	select {
	case <-reused:
		t.Fatal("a socket whose body never ended was given to Reuse")
	default:
	}
}
