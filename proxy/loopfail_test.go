package proxy_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/proxy"
)

// TestLoopFailureIsNotTheBackends: when the event loops fail (their
// epoll_wait fails: evloop.Group.BreakWaits replaces their epoll
// descriptors with /dev/null's, as evloop's TestWaitFailureEndsTheLoop
// does), the streams they held end with the internal_error event, not
// with an error that counts against the backend: it stays healthy with
// no failure load, and no "upstream attempt failed" is logged. A stream
// handed off after that is refused by the failed loops: it ends with the
// same internal_error event (the loops failed; the node is not draining),
// and the access log says internal_error, not shutting_down.
func TestLoopFailureIsNotTheBackends(t *testing.T) {
	b := newStepBackend(t, 4)
	t.Cleanup(func() { // before the backend's Close: its handlers report cancellations
		for {
			select {
			case <-b.cancelled:
			case <-time.After(time.Second):
				return
			}
		}
	})
	pool := poolOf(b.url)
	pool.EjectAfter = 1 // one failure counted would eject it
	errLog := &logBuffer{}
	e := startEdge(t, edgeOpts{pool: pool, h1up: true, errLog: errLog})
	backend := e.pools["p"].Backends()[0]
	var resps []*http.Response
	for range 2 {
		resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
		defer resp.Body.Close()
		resps = append(resps, resp)
	}
	onLoop(t, e, 2)
	proxy.BreakLoops(e.handler)
	for i, resp := range resps {
		checkInternalError(t, resp, i)
	}
	onLoop(t, e, 0)
	// The refused hand-off: the first token went out before Add.
	resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
	defer resp.Body.Close()
	checkInternalError(t, resp, 2)
	// The backend's three requests were cancelled: the failed
	// loops closed their sockets (and the refused stream's).
	b.waitCancelledN(t, 3, "after the loops failed")
	now := time.Now()
	if !backend.Healthy(now) || backend.FailureLoad(now) != 0 {
		t.Fatalf("backend healthy %v, failure load %v after the loops failed; want healthy, 0",
			backend.Healthy(now), backend.FailureLoad(now))
	}
	waitFor(t, 5*time.Second, "three access log lines with internal_error", func() bool {
		return len(e.log.lines(`"internal_error"`)) == 3
	})
	if n := len(e.log.lines("shutting_down")); n != 0 {
		t.Fatalf("%d access log lines say shutting_down", n)
	}
	if got := errLog.lines("upstream attempt failed"); len(got) != 0 {
		t.Fatalf("the loops' failure was logged as the backend's: %q", got)
	}
	if got := errLog.lines("event loop failed"); len(got) != 3 {
		t.Fatalf("%d log lines say the event loop failed; want 3", len(got))
	}
}

// checkInternalError reads a stream that the failed loops ended: its
// first token, then the internal_error event (the connection may close
// after it without the last chunk: a failing loop writes the last bytes
// best effort).
func checkInternalError(t *testing.T, resp *http.Response, i int) {
	t.Helper()
	if resp.StatusCode != 200 {
		t.Fatalf("stream %d: status %d", i, resp.StatusCode)
	}
	events, err := readEventsErr(resp.Body)
	if err != io.EOF && err != io.ErrUnexpectedEOF {
		t.Fatalf("stream %d ended with %v", i, err)
	}
	if len(events) != 2 || !strings.Contains(events[0].data, `"content":"t0"`) {
		t.Fatalf("stream %d: events %+v; want the first token and the error event", i, events)
	}
	if last := events[1]; last.name != "error" || !strings.Contains(last.data, `"internal_error"`) {
		t.Fatalf("stream %d: last event %+v; want the internal_error event", i, last)
	}
}
