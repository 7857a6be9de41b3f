package evloop

import (
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/chunked"
)

// TestHelpedAddStillSwept: a stream that a helper started on a loop that
// had none (Group.Help right after Group.Add, as the proxy's hand-off
// does) is still swept: its idle timeout ends it although no byte ever
// arrives. The helper's epoll_wait takes the add's wake-up, and the
// loop's goroutine, parked without a deadline while it had no stream,
// must not be left asleep. An HTTP/1.1 client's socket, writable when
// registered, woke it; a stream with a ClientSink (HTTP/2, HTTP/3) has no
// such socket. With one P the helper always wins the race (the loop's
// goroutine cannot run between the Add and the Help).
func TestHelpedAddStillSwept(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	g := newGroup(t, Options{Loops: 1, Sweep: 10 * time.Millisecond})
	for round := range 5 {
		time.Sleep(time.Duration(helpAfter) + 5*time.Millisecond) // the loop is parked, not polled lately
		r := newRelay()
		ln := listen(t)
		us, upc := pair(t, ln)
		s := Stream{Sink: newFakeSink(1 << 20), Upstream: us, Relay: r, Decoder: new(chunked.Decoder), Idle: 50 * time.Millisecond}
		if _, err := g.Add(&s); err != nil {
			t.Fatal(err)
		}
		g.Help()
		select {
		case res := <-r.closed:
			if !errors.Is(res.err, ErrIdle) {
				t.Fatalf("round %d: closed with %v; want ErrIdle", round, res.err)
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("round %d: a silent stream started by a helper was not ended by its 50ms idle timeout in 3s", round)
		}
		upc.Close()
	}
}
