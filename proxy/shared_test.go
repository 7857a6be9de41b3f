package proxy_test

import (
	"testing"

	"github.com/sluice-proxy/sluice/proxy"
)

// TestLoopDupConns runs the keep-alive, reuse and loop tests with the
// sockets taken out of Go's netpoller at the hand-off and rebuilt at the
// end (the way before evloop.Stream.Shared, kept for comparison).
func TestLoopDupConns(t *testing.T) {
	proxy.SetSharedConns(false)
	defer proxy.SetSharedConns(true)
	for name, f := range map[string]func(*testing.T){
		"KeepAlive": TestLoopKeepAlive, "KeepAlivePipelined": TestLoopKeepAlivePipelined,
		"KeepAliveConnCap": TestLoopKeepAliveConnCap, "KeepAliveDrain": TestLoopKeepAliveDrain,
		"KeepAliveProxyProtocol": TestLoopKeepAliveProxyProtocol, "ReusesBackendConn": TestLoopReusesBackendConn,
		"ClientGoneClosesBackendConn":   TestLoopClientGoneClosesBackendConn,
		"BytesPastBodyCloseBackendConn": TestLoopBytesPastBodyCloseBackendConn,
		"ReturnedConnClosedByBackend":   TestLoopReturnedConnClosedByBackend,
		"EachTokenAtOnce":               TestLoopEachTokenAtOnce, "ClientGoneCancelsBackend": TestLoopClientGoneCancelsBackend,
		"BackendDiesMidStream": TestLoopBackendDiesMidStream, "Drain": TestLoopDrain,
	} {
		t.Run(name, f)
	}
}
