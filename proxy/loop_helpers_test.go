package proxy_test

import (
	"flag"
	"strings"

	"github.com/sluice-proxy/sluice/routing"
)

// allH1up runs every edge of the tests with Sluice's own HTTP/1.1
// upstream client where a pool allows it, so that the whole suite's h1
// streams go through the event loops: go test ./proxy -args -proxy.h1up
var allH1up = flag.Bool("proxy.h1up", false, "reach plain HTTP/1.1 pools with proxy/h1up in every test edge (h1 streams then take the event loops)")

// allNoLoop keeps every test edge's streams on their goroutines (to tell
// the event loop's failures from the upstream client's).
var allNoLoop = flag.Bool("proxy.noloop", false, "no event loops in the test edges")

// plainHTTP1 reports whether h1up can reach pc's backends: cleartext
// HTTP/1.1.
func plainHTTP1(pc routing.PoolConfig) bool {
	if pc.H2C || pc.TLS != nil || pc.HTTP2 == routing.HTTP2On {
		return false
	}
	for _, b := range pc.Backends {
		if !strings.HasPrefix(b.URL, "http://") {
			return false
		}
	}
	return true
}
