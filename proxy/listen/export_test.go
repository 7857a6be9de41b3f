package listen

import "time"

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

// SetH1HeadTimeout sets the header timeout of s's own HTTP/1.1 servers;
// call it after Listen and before Serve.
func SetH1HeadTimeout(s *Server, d time.Duration) {
	for _, srv := range s.servers {
		if hs, ok := srv.(*h1Server); ok {
			hs.headTimeout = d
		}
	}
}
