package listen

import "os"

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

// listen's own tests run the own request parser (off by default in the
// binary) unless SLUICE_H1_PARSER=nethttp says otherwise.
func init() { h1OwnParser = os.Getenv("SLUICE_H1_PARSER") != "nethttp" }
