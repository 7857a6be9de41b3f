package evloop

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/chunked"
)

// keepRelay is chunkRelay that keeps the client's socket (Keeper).
type keepRelay struct {
	*chunkRelay
	kept chan int
}

func (r keepRelay) Keep(fd int) bool { r.kept <- fd; return true }

// TestKeepAndReuse: a stream that ends cleanly gives both
// connections back open, as they were: Reuse and Keep get their own
// descriptors, out of the loop's epoll set, and the net.Conns still carry
// bytes both ways; the loop closes neither.
func TestKeepAndReuse(t *testing.T) {
	g := newGroup(t, Options{Loops: 1})
	ln := listen(t)
	cs, cl := pair(t, ln)
	us, up := pair(t, ln)
	defer cl.Close()
	defer up.Close()
	r := keepRelay{newRelay(), make(chan int, 1)}
	reused := make(chan int, 1)
	cfd, _ := fdOf(cs)
	ufd, _ := fdOf(us)
	_, err := g.Add(&Stream{Client: cs, Upstream: us, Relay: r, Decoder: new(chunked.Decoder), Idle: time.Minute,
		KeepInput: true, Reuse: func(fd int) { reused <- fd }})
	if err != nil {
		t.Fatal(err)
	}
	up.Write(chunked.AppendLast(chunked.AppendChunk(nil, []byte(ev(0)+"data: [DONE]\n\n")), nil))
	got, err := readEvents(cl)
	if err != nil || len(got) != 2 || got[0] != ev(0) {
		t.Fatalf("events %q %v", got, err)
	}
	for _, c := range []struct {
		ch         chan int
		fd         int
		mine, peer net.Conn
	}{{reused, ufd, us, up}, {r.kept, cfd, cs, cl}} {
		select {
		case fd := <-c.ch:
			if fd != c.fd {
				t.Fatalf("given fd %d; want the conn's own %d", fd, c.fd)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("not given back")
		}
		// Still open both ways, and read through Go's netpoller again.
		c.peer.Write([]byte("next"))
		c.mine.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c.mine, buf); err != nil || string(buf) != "next" {
			t.Fatalf("read after the stream: %q %v", buf, err)
		}
		if _, err := c.mine.Write([]byte("back")); err != nil {
			t.Fatal(err)
		}
		c.peer.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c.peer, buf); err != nil || string(buf) != "back" {
			t.Fatalf("peer read: %q %v", buf, err)
		}
		c.mine.Close()
	}
	if res := r.wait(t); res.err != nil {
		t.Fatal(res.err)
	}
}
