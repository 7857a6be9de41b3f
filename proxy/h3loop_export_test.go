package proxy

// SetH3Loop turns the hand-off of HTTP/3 streams to the event loops
// (SLUICE_H3_LOOP, on by default) on or off and returns the previous setting.
func SetH3Loop(on bool) bool { return h3Loop.Swap(on) }
