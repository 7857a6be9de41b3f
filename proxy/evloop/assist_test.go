package evloop

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/chunked"
)

// TestAssistRelaysLongBatches: with an assistant taking part of every
// batch of two or more reads (Options.Assist), many streams written at
// once each get all their events, in order, and their end: [DONE] (left
// to the loop to settle) or the backend's cut (left as an end). The
// second run leaves every item to the assistant (assistOnly), so that
// what it leaves is settled by the loop whatever the scheduling.
func TestAssistRelaysLongBatches(t *testing.T) {
	t.Run("shared", testAssist)
	t.Run("assistant only", func(t *testing.T) {
		assistOnly.Store(true)
		defer assistOnly.Store(false)
		testAssist(t)
	})
}

func testAssist(t *testing.T) {
	g := newGroup(t, Options{Loops: 1, Assist: 2})
	const n, rounds = 24, 20
	ups := make([]net.Conn, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	rs := make([]*chunkRelay, n)
	for i := range n {
		up, cl, r := streamOn(t, g, Stream{Idle: time.Minute})
		ups[i], rs[i] = up, r
		wg.Add(1)
		go func() {
			defer wg.Done()
			// rounds events, then [DONE] or (cut by the backend) the error event
			got, err := readEvents(cl)
			if err != nil || len(got) != rounds+1 {
				errs <- fmt.Errorf("stream %d: %d events, %v", i, len(got), err)
				return
			}
			for k := range rounds {
				if got[k] != ev(k) {
					errs <- fmt.Errorf("stream %d: event %d is %q", i, k, got[k])
					return
				}
			}
		}()
	}
	for k := range rounds {
		for i := range n {
			ups[i].Write(chunked.AppendChunk(nil, []byte(ev(k))))
		}
		time.Sleep(time.Millisecond)
	}
	for i := range n {
		if i%8 == 7 {
			ups[i].Close()
		} else {
			ups[i].Write(chunked.AppendChunk(nil, []byte("data: [DONE]\n\n")))
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := range n {
		res := rs[i].wait(t)
		if (res.err != nil) != (i%8 == 7) {
			t.Errorf("stream %d ended with %v", i, res.err)
		}
	}
}
