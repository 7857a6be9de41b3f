package proxy

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/proxy/listen"
)

type closeCounter struct{ n atomic.Int32 }

func (c *closeCounter) Close() error { c.n.Add(1); return nil }

// heldAttempt is a live attempt context under parent (its registration
// ended at the test's end), its Done, and the connection it holds.
func heldAttempt(t *testing.T, parent context.Context) (*attemptCtx, <-chan struct{}, *closeCounter) {
	c := new(attemptCtx)
	c.start(parent)
	t.Cleanup(c.unwatch)
	done := c.Done()
	conn := &closeCounter{}
	c.HoldConn(conn)
	return c, done, conn
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: Done not closed", what)
	}
}

// TestAttemptCtxOwnCancel: the leg's own cancel sets the cause (the first
// wins), closes Done and the held connection, and a later end of the
// request's context changes nothing.
func TestAttemptCtxOwnCancel(t *testing.T) {
	parent, cancelParent := context.WithCancelCause(context.Background())
	c, done, conn := heldAttempt(t, parent)
	if c.Err() != nil || c.Cause() != nil {
		t.Fatalf("live context: Err %v, Cause %v", c.Err(), c.Cause())
	}
	c.cancel(errHedgeLost)
	c.cancel(errFirstTokenTimeout)
	cancelParent(errors.New("later"))
	waitClosed(t, done, "own cancel")
	if !errors.Is(c.Err(), context.Canceled) || c.Cause() != errHedgeLost {
		t.Fatalf("Err %v, Cause %v; want Canceled and the first cause", c.Err(), c.Cause())
	}
	if causeOf(c, errors.New("transport")) != errHedgeLost {
		t.Fatal("causeOf does not prefer the attempt's cause")
	}
	if conn.n.Load() != 1 || c.ReleaseConn() {
		t.Fatalf("held conn closed %d times, ReleaseConn true; want 1 and false", conn.n.Load())
	}
	late := &closeCounter{}
	c.HoldConn(late)
	if late.n.Load() != 1 {
		t.Fatal("HoldConn on a cancelled context did not close the connection at once")
	}
}

// TestAttemptCtxParent: the request's context ending cancels the attempt
// with its error and cause: at once for Err, and through the registration
// (its own goroutine) for Done and the held connection.
func TestAttemptCtxParent(t *testing.T) {
	errGone := errors.New("client gone")
	t.Run("registration", func(t *testing.T) {
		parent, cancelParent := context.WithCancelCause(context.Background())
		c, done, conn := heldAttempt(t, parent)
		cancelParent(errGone)
		waitClosed(t, done, "parent cancel")
		// The registration's goroutine closes Done, then the connection
		// (cancel closes it outside its lock): wait for the close too.
		for deadline := time.Now().Add(5 * time.Second); conn.n.Load() == 0 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		if !errors.Is(c.Err(), context.Canceled) || c.Cause() != errGone || conn.n.Load() != 1 {
			t.Fatalf("Err %v, Cause %v, conn closed %d; want Canceled, the parent's cause, 1", c.Err(), c.Cause(), conn.n.Load())
		}
		c.cancel(errHedgeLost)
		if c.Cause() != errGone {
			t.Fatalf("Cause %v after a later own cancel; want the parent's", c.Cause())
		}
	})
	t.Run("seen-first", func(t *testing.T) {
		parent, cancelParent := context.WithCancelCause(context.Background())
		var c attemptCtx
		c.start(parent)
		c.unwatch() // no registration: only Err's own look at the parent
		conn := &closeCounter{}
		c.HoldConn(conn)
		cancelParent(errGone)
		if c.Cause() != errGone || c.Err() == nil {
			t.Fatalf("Cause %v, Err %v; want the parent's at once", c.Cause(), c.Err())
		}
		waitClosed(t, c.Done(), "Err's cancel")
		if conn.n.Load() != 1 || c.ReleaseConn() {
			t.Fatal("the held connection was not closed")
		}
	})
	t.Run("release", func(t *testing.T) {
		parent, cancelParent := context.WithCancelCause(context.Background())
		var c attemptCtx
		c.start(parent)
		conn := &closeCounter{}
		c.HoldConn(conn)
		if !c.ReleaseConn() {
			t.Fatal("ReleaseConn false on a live context")
		}
		c.unwatch()
		cancelParent(errGone)
		if c.ReleaseConn() {
			t.Fatal("ReleaseConn true after the request's context ended")
		}
		if conn.n.Load() != 0 {
			t.Fatal("a released connection was closed")
		}
	})
}

// TestAttemptCtxChildren: context.WithCancelCause and context.AfterFunc
// of an attempt context work through its AfterFunc (no goroutine each).
func TestAttemptCtxChildren(t *testing.T) {
	var c attemptCtx
	c.start(context.Background())
	defer c.unwatch()
	child, cancelChild := context.WithCancelCause(&c)
	defer cancelChild(nil)
	ran := make(chan struct{})
	context.AfterFunc(&c, func() { close(ran) })
	stopped := context.AfterFunc(&c, func() { t.Error("a stopped AfterFunc ran") })
	c.mu.Lock()
	n := len(c.fns)
	c.mu.Unlock()
	if n != 3 {
		t.Fatalf("%d registrations on the attempt context; want 3 (WithCancelCause, two AfterFunc)", n)
	}
	if !stopped() {
		t.Fatal("stop of a pending AfterFunc reported false")
	}
	c.cancel(errStreamIdle)
	waitClosed(t, child.Done(), "child")
	waitClosed(t, ran, "AfterFunc")
	if !errors.Is(child.Err(), context.Canceled) {
		t.Fatalf("child Err %v", child.Err())
	}
	if stopped() {
		t.Fatal("stop reported true twice")
	}
	time.Sleep(10 * time.Millisecond) // the stopped func would have run by now
}

// BenchmarkAttemptContext is a small request's attempt-context work, the
// old way and the new (leg9): the request's context (a cancelCtx, as the
// own h1 server's), then per attempt: "stdlib" is the
// context.WithCancelCause the leg made and the context.AfterFunc h1up
// registered on it, stopped when the body ended, and the leg's cancel at
// close; "attemptctx" is attemptCtx's one registration on the request's
// context, h1up's HoldConn and ReleaseConn, the cancel and unwatch at
// close.
//
//	go test -run '^$' -bench BenchmarkAttemptContext -benchmem ./proxy/
func BenchmarkAttemptContext(b *testing.B) {
	conn := &closeCounter{}
	b.Run("stdlib", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			req, cancelReq := context.WithCancelCause(context.Background())
			ctx, cancel := context.WithCancelCause(req)
			stop := context.AfterFunc(ctx, func() { conn.Close() })
			stop()
			cancel(context.Canceled)
			cancelReq(nil)
		}
	})
	b.Run("attemptctx", func(b *testing.B) {
		b.ReportAllocs()
		var l leg
		for b.Loop() {
			req, cancelReq := context.WithCancelCause(context.Background())
			l.ctx = attemptCtx{}
			c := &l.ctx
			c.start(req)
			c.HoldConn(conn)
			c.ReleaseConn()
			c.cancel(context.Canceled)
			c.unwatch()
			cancelReq(nil)
		}
	})
}

// TestAttemptCtxWaiting: h1up's Waiting on an attempt with an owner reads
// the client's RTT then (once: netRTT keeps it); without an owner (a
// hedged leg, on its own goroutine) it touches no exchange.
func TestAttemptCtxWaiting(t *testing.T) {
	var reads atomic.Int32
	x := &exchange{conn: listen.ConnInfo{RTT: func() time.Duration { reads.Add(1); return 3 * time.Millisecond }}}
	var hedged attemptCtx
	hedged.Waiting()
	if reads.Load() != 0 || x.rttRead {
		t.Fatalf("an attempt without an owner read the RTT (%d reads)", reads.Load())
	}
	c := attemptCtx{owner: x}
	c.Waiting()
	if reads.Load() != 1 || !x.rttRead {
		t.Fatalf("after Waiting: %d RTT reads, read %v; want 1, true", reads.Load(), x.rttRead)
	}
	if d, ok := x.netRTT(); d != 3*time.Millisecond || !ok || reads.Load() != 1 {
		t.Fatalf("netRTT after Waiting: %v %v, %d reads; want 3ms true, still 1", d, ok, reads.Load())
	}
}
