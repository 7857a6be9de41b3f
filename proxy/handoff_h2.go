package proxy

import (
	"net/http"
	"os"
	"sync/atomic"

	"github.com/sluice-proxy/sluice/proxy/evloop"
	"github.com/sluice-proxy/sluice/proxy/listen"
)

// Committed HTTP/2 streams on the event loops (the default; SLUICE_H2_LOOP=0
// keeps them on their handlers' goroutines): once a
// stream's head and first event have been flushed on the handler's
// goroutine, the backend's socket (detached from h1up, as for HTTP/1.1)
// goes to a loop, and the client's side is the stream on Sluice's own
// HTTP/2 connection (listen.H2LoopStream, an evloop.ClientSink): the loop
// frames the events as DATA into the connection's buffer and wakes its
// writer once per batch. No goroutine waits on the stream. See
// docs/ARCHITECTURE.md, "Event loop".

// H2LoopEnv names the environment variable that turns the hand-off of
// HTTP/2 streams to the event loops off ("0"; on by default since branch
// h2loop measured it: docs/BENCHMARKS.md, "h2loop").
const H2LoopEnv = "SLUICE_H2_LOOP"

// h2Loop turns the HTTP/2 hand-off on (H2LoopEnv; the tests set it).
var h2Loop = switchOn(H2LoopEnv)

// switchOn is an on-by-default switch that the environment variable name
// turns off ("0").
func switchOn(name string) *atomic.Bool {
	on := new(atomic.Bool)
	on.Store(os.Getenv(name) != "0")
	return on
}

// framedPendingSeen, when set (tests), is shown each framed hand-off's
// request id and the backend's input it leaves to the loop.
var framedPendingSeen atomic.Pointer[func(id string, pending []byte)]

// detachH2 is listen.DetachH2 as a loopClient.
func detachH2(w http.ResponseWriter) (loopClient, bool) { return asLoopClient(listen.DetachH2(w)) }

// asLoopClient gives a listener's detached stream as a loopClient (nil,
// false when it was not detached).
func asLoopClient[C loopClient](c C, ok bool) (loopClient, bool) {
	if !ok {
		return nil, false
	}
	return c, true
}

// loopClient is the client's side of a framed stream on a loop: an
// HTTP/2 stream of Sluice's own server (listen.H2LoopStream) or a
// taken-over HTTP/3 stream (listen.H3LoopStream, handoff_h3.go).
type loopClient interface {
	evloop.ClientSink
	// Reattach gives the stream back to its handler (no loop took it).
	Reattach()
	// SetTrailer sets the trailer the stream's end carries.
	SetTrailer(http.Header)
}

// handOffFramed moves an HTTP/2 or HTTP/3 stream whose head and first
// event were sent to an event loop, when it can: Sluice's own HTTP/2
// server or a taken-over HTTP/3 stream, the HTTP sink, a backend body
// that detaches. It reports false, having changed nothing, when the
// stream stays on this goroutine; else relayOpenAI returns err
// (errHandedOff when the loop has the stream).
func (x *exchange) handOffFramed(l *leg) (bool, error) {
	r := x.r
	var detach func(http.ResponseWriter) (loopClient, bool)
	switch {
	case r.ProtoMajor == 2 && h2Loop.Load():
		detach = detachH2
	case r.ProtoMajor == 3 && h3Loop.Load():
		detach = detachH3
	default:
		return false, nil
	}
	s, d, g := x.loopable(l)
	if g == nil {
		return false, nil
	}
	hs, ok := detach(s.w)
	if !ok {
		return false, nil
	}
	up, raw, dec, remaining, err := d.Detach()
	if err != nil {
		hs.Reattach()
		return false, nil
	}
	x.netRTT() // read while the handler runs (the access log reports it)
	reuse := reuseFunc(l.resp.Body, up)
	l.wd.stop() // the loop watches idleness
	ls := &loopStream{x: x, l: l, done: make(chan struct{}), framed: hs, uncount: func() {}}
	ls.sink.framed = true
	ls.sink.trailer = wantsTrailer(r)
	pending := l.handOverBuffers()
	if f := framedPendingSeen.Load(); f != nil {
		(*f)(x.id, pending)
	}
	x.sink = &ls.sink
	x.shed(l)
	ls.holdServer(r.Context())
	x.loop = ls
	es := &evloop.Stream{Sink: hs, Upstream: up, Pending: pending, Raw: raw, Decoder: dec, Remaining: remaining,
		Idle: x.st.Config.StreamIdleTimeout, Relay: ls, Reuse: reuse}
	h, err := g.Add(es)
	if err != nil {
		// No loop took it (closed or failed loops, or the backend's
		// socket could not be taken): the stream is this goroutine's
		// again, and ends here with the error event.
		ls.refused()
		hs.Reattach()
		x.sink = s
		cause := addErr(err)
		x.loopFailed(l, cause) // the error event (loopFailed logs a loop's failure)
		return true, cause
	}
	ls.h = h
	x.hsink = httpSink{} // the loop writes the stream: drop the handler's writer (see handOffRest)
	close(ls.done)
	x.h.helpLoops()
	return true, errHandedOff
}
