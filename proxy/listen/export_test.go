package listen

// QUICCounts returns the QUIC connections each client IP holds and the
// handshakes in progress on s's HTTP/3 listener.
func QUICCounts(s *Server) (map[string]int, int64) {
	if s.h3 == nil {
		return nil, 0
	}
	return s.h3.gate.counts()
}

// MaxHeaderBytes is the listeners' header limit.
const MaxHeaderBytes = maxHeaderBytes

// H1WatchDelay is the own h1 server's default watch delay.
const H1WatchDelay = h1WatchDelay
