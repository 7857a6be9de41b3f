package proxy

import (
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
var h2Loop atomic.Bool

func init() { h2Loop.Store(os.Getenv(H2LoopEnv) != "0") }

// handOffH2 moves an HTTP/2 stream whose head and first event were sent
// to an event loop, when it can: Sluice's own HTTP/2 server, the HTTP
// sink, a backend body that detaches. It reports false, having changed
// nothing, when the stream stays on this goroutine; else relayOpenAI
// returns err (errHandedOff when the loop has the stream).
func (x *exchange) handOffH2(l *leg) (bool, error) {
	r := x.r
	if !h2Loop.Load() || r.ProtoMajor != 2 {
		return false, nil
	}
	s, d, g := x.loopable(l)
	if g == nil {
		return false, nil
	}
	hs, ok := listen.DetachH2(s.w)
	if !ok {
		return false, nil
	}
	up, raw, dec, remaining, err := d.Detach()
	if err != nil {
		hs.Reattach()
		return false, nil
	}
	x.netRTT() // read while the handler runs (the access log reports it)
	shared := sharedConns.Load()
	reuse := reuseFunc(l.resp.Body, up, shared)
	l.wd.stop() // the loop watches idleness
	ls := &loopStream{x: x, l: l, done: make(chan struct{}), shared: shared, h2: hs, uncount: func() {}}
	ls.sink.framed = true
	ls.sink.trailer = wantsTrailer(r)
	pending := l.handOverBuffers()
	x.sink = &ls.sink
	x.shed(l)
	ls.holdServer(r.Context())
	x.loop = ls
	es := &evloop.Stream{Sink: hs, Upstream: up, Pending: pending, Raw: raw, Decoder: dec, Remaining: remaining,
		Idle: x.st.Config.StreamIdleTimeout, Relay: ls, Reuse: reuse, Shared: shared}
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
	close(ls.done)
	x.h.helpLoops()
	return true, errHandedOff
}
