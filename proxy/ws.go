package proxy

import (
	"errors"
	"net/http"
	"sync/atomic"

	"github.com/sluice-proxy/sluice/proxy/ws"
)

// ProtoWS is listen.ConnInfo.Proto (and the proto label of metrics and
// the access log) for requests made over the WebSocket bridge.
const ProtoWS = "ws"

var (
	errSlowClient = errors.New("client did not read frames in time")
	errConnGone   = errors.New("websocket connection closed")
)

// wsStats are the handler's WebSocket counters (for tests and metrics).
type wsStats struct {
	// peakQueued is the most bytes any one bridged socket has had queued
	// for its client (frames in the send queue, frames waiting to enter
	// it, and the frame being written).
	peakQueued atomic.Int64
}

func (s *wsStats) queued(n int64) {
	for {
		p := s.peakQueued.Load()
		if n <= p || s.peakQueued.CompareAndSwap(p, n) {
			return
		}
	}
}

// wsKey extracts the API key of a WebSocket upgrade: Authorization: Bearer,
// x-api-key, or the subprotocol "sluice.key.<key>". fromProtocol tells that
// it came from the subprotocol.
func wsKey(r *http.Request) (key string, fromProtocol bool) {
	if k := apiKey(r, false); k != "" {
		return k, false
	}
	if k := ws.SubprotocolKey(r); k != "" {
		return k, true
	}
	return "", false
}
