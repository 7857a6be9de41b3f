package proxy

// SetH2Loop turns the hand-off of HTTP/2 streams to the event loops
// (SLUICE_H2_LOOP, on by default) on or off and returns the previous setting.
func SetH2Loop(on bool) bool { return h2Loop.Swap(on) }
