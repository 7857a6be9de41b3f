package proxy

import (
	"net/http"

	"github.com/sluice-proxy/sluice/proxy/ws"
)

// WebSocketKey extracts the API key of a WebSocket upgrade: Authorization:
// Bearer, x-api-key, or the subprotocol "sluice.key.<key>" (browsers cannot
// set headers). fromProtocol tells that it came from the subprotocol. The
// key is "" when the request carries none.
func WebSocketKey(r *http.Request) (key string, fromProtocol bool) {
	if k := apiKey(r, false); k != "" {
		return k, false
	}
	if k := ws.SubprotocolKey(r); k != "" {
		return k, true
	}
	return "", false
}
