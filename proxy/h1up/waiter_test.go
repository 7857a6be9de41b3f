package h1up

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// waitCtx is a Waiter that counts its calls and closes called at the
// first.
type waitCtx struct {
	context.Context
	n      atomic.Int32
	once   sync.Once
	called chan struct{}
}

func (c *waitCtx) Waiting() {
	c.n.Add(1)
	c.once.Do(func() { close(c.called) })
}

// A Waiter is told once per request, after the request was written and
// before its answer's head is read: the backend below holds its answer
// until Waiting has run, so a transport that called it only after the
// head (or not at all) gets "late" instead of "ok". The same on a reused
// connection without sendWait; with sendWait (the wait is part of the
// write) it is called once, after the answer arrived.
func TestWaiterCalledWhileBackendWorks(t *testing.T) {
	saved := sendWaitOn
	t.Cleanup(func() { sendWaitOn = saved })
	var held chan struct{} // the current request's Waiting, set before each request
	var heldMu sync.Mutex
	srv := newRawServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			if _, err := io.Copy(io.Discard, req.Body); err != nil {
				return
			}
			heldMu.Lock()
			ch := held
			heldMu.Unlock()
			msg := "ok"
			if ch != nil { // nil: this request does not hold its answer
				select {
				case <-ch:
				case <-time.After(3 * time.Second):
					msg = "late"
				}
			}
			if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+
				string(rune('0'+len(msg)))+"\r\n\r\n"+msg); err != nil {
				return
			}
		}
	})
	tr := New(Options{})
	defer tr.CloseIdleConnections()
	url := "http://" + srv.ln.Addr().String() + "/v1/chat/completions"
	for i, tc := range []struct {
		name     string
		sendWait bool
		hold     bool
	}{
		{"fresh connection", false, true},
		{"reused connection", false, true},
		{"reused connection, sendWait", true, false},
	} {
		sendWaitOn = tc.sendWait
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		wc := &waitCtx{Context: ctx, called: make(chan struct{})}
		heldMu.Lock()
		held = nil
		if tc.hold {
			held = wc.called
		}
		heldMu.Unlock()
		req, _ := http.NewRequestWithContext(wc, http.MethodPost, url, strings.NewReader(`{"model":"m"}`))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			cancel()
			t.Fatalf("%s: %v", tc.name, err)
		}
		body := readAll(t, resp)
		cancel()
		if body != "ok" {
			t.Errorf("%s: answer %q; want ok (Waiting did not run before the head was read)", tc.name, body)
		}
		if n := wc.n.Load(); n != 1 {
			t.Errorf("%s: Waiting ran %d times; want 1", tc.name, n)
		}
		if want := int32(1); srv.accepts.Load() != want {
			t.Errorf("request %d (%s): %d connections; want %d (the cases after the first reuse it)", i, tc.name, srv.accepts.Load(), want)
		}
	}
}
