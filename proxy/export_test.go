package proxy

// SetSharedConns sets how streams go to the event loops (sharedConns),
// for the tests and benchmarks of both ways.
func SetSharedConns(on bool) { sharedConns.Store(on) }
