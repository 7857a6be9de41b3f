package proxy

import (
	"net/http"

	"github.com/sluice-proxy/sluice/proxy/listen"
)

// Committed HTTP/3 streams on the event loops (SLUICE_H3_LOOP=0 keeps
// them on their handlers' goroutines): once a stream's head and first
// event have been written on the handler's goroutine (the HTTP/3 listener
// took the stream over from quic-go's response writer at that flush,
// listen.h3Writer), the backend's socket (detached from h1up, as for
// HTTP/1.1) goes to a loop, and the client's side is the QUIC stream
// (listen.H3LoopStream, an evloop.ClientSink): the loop gives each batch's
// bytes to it as one DATA frame without blocking; a stream whose window is
// closed pauses the backend's reads until a goroutine that exists only
// while it waits has written the frame. handOffFramed (handoff_h2.go)
// does the hand-off for both protocols. See docs/ARCHITECTURE.md, "Event
// loop".

// H3LoopEnv names the environment variable that turns the hand-off of
// HTTP/3 streams to the event loops off ("0").
const H3LoopEnv = "SLUICE_H3_LOOP"

// h3Loop turns the HTTP/3 hand-off on (H3LoopEnv; the tests set it).
var h3Loop = switchOn(H3LoopEnv)

// detachH3 is listen.DetachH3 as a loopClient.
func detachH3(w http.ResponseWriter) (loopClient, bool) { return asLoopClient(listen.DetachH3(w)) }
