package proxy

// SetLoopHelp turns the request path's help to the event loops
// (Handler.helpLoops) on or off.
func SetLoopHelp(on bool) { noHelp.Store(!on) }

// BreakLoops makes every event loop of h fail as a broken epoll set would
// (evloop.Group.BreakWaits) and returns once they have stopped.
func BreakLoops(h *Handler) {
	if g := h.loops.g.Load(); g != nil {
		g.BreakWaits()
	}
}

// SetParkKept sets whether kept client connections wait on the event
// loops (parkKept), for the tests of both ways.
func SetParkKept(on bool) { parkKept.Store(on) }

// SetFirstBytesSeen shows f every h1 loop hand-off's first bytes (head and
// the events written before the hand-off) and the backend's input left to
// the loop; nil stops it.
func SetFirstBytesSeen(f func(first, rest []byte)) {
	if f == nil {
		firstBytesSeen.Store(nil)
		return
	}
	firstBytesSeen.Store(&f)
}

// SetFramedPendingSeen shows f every HTTP/2 or HTTP/3 loop hand-off's
// request id and the backend's bytes it leaves to the loop (nil: none).
func SetFramedPendingSeen(f func(id string, pending []byte)) {
	if f == nil {
		framedPendingSeen.Store(nil)
		return
	}
	framedPendingSeen.Store(&f)
}
