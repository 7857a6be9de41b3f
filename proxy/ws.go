package proxy

import (
	"net/http"

	"github.com/sluice-proxy/sluice/proxy/listen"
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

// wsSockets is the Handler's count of open sockets (a field there).
type wsSockets = ws.Sockets

// OpenWebSocket takes a place for one socket of tenant from r's client
// address (its IP, or IPv6 /64 prefix; bridge and passthrough share the caps
// proxy.websocket.max_sockets_per_addr and max_sockets_per_tenant), or
// returns the 429 to answer before the upgrade. release frees the place;
// it is idempotent and must run on every exit path (defer it).
func (h *Handler) OpenWebSocket(r *http.Request, tenant string, cfg ws.Config) (release func(), err error) {
	release, over := h.sockets.Acquire(listen.ClientKey(r.RemoteAddr), tenant, cfg.MaxSocketsPerAddr, cfg.MaxSocketsPerTenant)
	switch over {
	case ws.OverAddr:
		return nil, errSocketsPerAddr
	case ws.OverTenant:
		return nil, errSocketsPerTenant
	}
	return release, nil
}

// OpenWebSockets returns the sockets counted against the caps now, and
// the client addresses and tenants holding them.
func (h *Handler) OpenWebSockets() (sockets, addrs, tenants int) { return h.sockets.Open() }

var (
	errSocketsPerAddr = &APIError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "too_many_websockets",
		Message: "too many WebSocket sockets open from this address (proxy.websocket.max_sockets_per_addr); close one and retry"}
	errSocketsPerTenant = &APIError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "too_many_websockets",
		Message: "too many WebSocket sockets open for this tenant (proxy.websocket.max_sockets_per_tenant); close one and retry"}
)
