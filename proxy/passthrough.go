package proxy

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-proxy/sluice/proxy/observe"
	"github.com/sluice-proxy/sluice/proxy/ws"
	"github.com/sluice-proxy/sluice/routing"
)

// passthrough relays a client WebSocket to a backend WebSocket endpoint
// (kind: websocket routes), frames both ways. The session is one stream
// for the tenant: admitted like any request, settled when it ends. The
// backend is dialled before the client is upgraded, so that a backend
// failure is still an HTTP error (retried on another backend first).
func (x *exchange) passthrough(route *routing.Route) error {
	r := x.r
	cfg := x.st.Config.WebSocket
	x.route = route
	x.bodyRead = time.Now() // no body; the route is the path's
	x.routed = x.bodyRead
	if !websocket.IsWebSocketUpgrade(r) || r.Method != http.MethodGet || x.responseWriter() == nil {
		x.sink.Header().Set("Upgrade", "websocket")
		return &APIError{Status: http.StatusUpgradeRequired, Type: "invalid_request_error", Code: "upgrade_required",
			Message: "this route relays WebSocket: send GET with Upgrade: websocket"}
	}
	if err := ws.CheckOrigin(r, cfg.AllowedOrigins); err != nil {
		return err
	}
	release, err := x.h.OpenWebSocket(r, x.tenant.ID, cfg)
	if err != nil {
		return err
	}
	defer release()
	if err := x.admit(); err != nil {
		return err
	}
	backend, att, err := x.dialAny()
	if err != nil {
		return err
	}
	defer att.End(routing.Finished)
	client, err := x.upgradeClient(backend.Subprotocol())
	if err != nil {
		backend.WriteControl(websocket.CloseMessage, ws.CloseMessage(websocket.CloseGoingAway, "client upgrade failed"),
			time.Now().Add(ws.CloseGrace))
		backend.Close()
		return err
	}
	x.firstToken = time.Now()
	x.h.metrics.WSOpen(observe.WSModePassthrough, 1)
	defer x.h.metrics.WSOpen(observe.WSModePassthrough, -1)
	relayed, err := ws.Relay(x.r.Context(), client, backend, cfg)
	x.bytesToUser += relayed
	x.lastToken = time.Now()
	return err
}

// dialAny dials a backend of the route's pool, trying others (up to the
// route's retries) when one cannot be reached or refuses the upgrade.
func (x *exchange) dialAny() (*websocket.Conn, Attempt, error) {
	retries := *x.st.Config.Retries
	if x.policy.Retries != nil {
		retries = *x.policy.Retries
	}
	var tried []*routing.Backend
	var lastErr error
	for attempt := 0; attempt <= retries; attempt++ {
		a, err := x.acquire(attempt, tried, false)
		if err != nil {
			if lastErr != nil {
				break
			}
			return nil, nil, err
		}
		b := a.Backend()
		tried = append(tried, b)
		x.backend = b
		conn, err := x.dialBackend(b)
		if err == nil {
			x.upstreamHeaders = time.Now()
			a.Progress(x.upstreamHeaders)
			return conn, a, nil
		}
		if x.r.Context().Err() != nil {
			a.End(routing.Finished)
			return nil, nil, err
		}
		a.End(routing.Failed)
		x.logAttempt(b, err)
		lastErr = err
	}
	return nil, nil, lastErr
}

// dialBackend opens the backend WebSocket: the backend's base URL plus the
// client's path and query, the client's headers without the handshake's,
// credentials and Origin, forwarding headers, and the client's
// subprotocols other than Sluice's own.
func (x *exchange) dialBackend(b *routing.Backend) (*websocket.Conn, error) {
	var protocols []string
	for _, p := range websocket.Subprotocols(x.r) {
		if !strings.HasPrefix(p, "sluice.") {
			protocols = append(protocols, p)
		}
	}
	timeout := x.st.Config.FirstTokenTimeout
	if x.policy.FirstTokenTimeout > 0 {
		timeout = x.policy.FirstTokenTimeout
	}
	d := &websocket.Dialer{
		NetDialContext:   (&net.Dialer{Timeout: x.st.Config.DialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		HandshakeTimeout: timeout,
		ReadBufferSize:   4 << 10,
		WriteBufferSize:  4 << 10,
		Subprotocols:     protocols,
		TLSClientConfig:  x.upstreamTLS(),
	}
	conn, resp, err := d.DialContext(x.r.Context(), x.wsURL(b), x.backendHeader())
	if resp != nil && resp.Body != nil {
		discard(resp.Body, 4<<10)
		resp.Body.Close()
	}
	switch {
	case err == nil:
		return conn, nil
	case resp != nil:
		return nil, &APIError{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_refused_upgrade",
			Message: fmt.Sprintf("the backend answered %d to the WebSocket upgrade", resp.StatusCode)}
	}
	return nil, err
}

// upstreamTLS is the client TLS config for a wss:// backend: the pool's
// (trusted CAs, client certificate, server name), offering only HTTP/1.1,
// the protocol a WebSocket handshake needs.
func (x *exchange) upstreamTLS() *tls.Config {
	cfg := &tls.Config{}
	if t := stdTransport(x.transport()); t != nil && t.TLSClientConfig != nil {
		cfg = t.TLSClientConfig.Clone()
	}
	cfg.NextProtos = []string{"http/1.1"}
	return cfg
}

// wsURL is the backend's WebSocket URL for the client's request.
func (x *exchange) wsURL(b *routing.Backend) string {
	u := x.backendURL(b)
	u.Scheme = "ws"
	if b.URL.Scheme == "https" {
		u.Scheme = "wss"
	}
	return u.String()
}

// backendHeader is the client's header without hop-by-hop fields, the
// handshake's own fields, credentials and Origin, plus forwarding headers,
// the request id and the pool's key.
func (x *exchange) backendHeader() http.Header {
	r := x.r
	hdr := http.Header{}
	copyRequestHeader(hdr, r.Header)
	for _, k := range []string{"Sec-Websocket-Key", "Sec-Websocket-Version", "Sec-Websocket-Extensions",
		"Sec-Websocket-Protocol", "Origin"} {
		hdr.Del(k)
	}
	proto := "http"
	if r.TLS != nil {
		proto = "https"
	}
	hdr.Set("X-Forwarded-For", clientIP(r))
	hdr.Set("X-Forwarded-Proto", proto)
	hdr.Set("X-Forwarded-Host", r.Host)
	hdr.Set("X-Request-Id", x.id)
	hdr.Set("X-Sluice-Request-Id", x.ownID)
	if key := x.route.Pool.Config().APIKey; key != "" {
		hdr.Set("Authorization", "Bearer "+key)
	}
	return hdr
}

// upgradeClient completes the client's handshake with the backend's
// subprotocol (or sluice.v1 when the client offered it only to carry its
// key).
func (x *exchange) upgradeClient(backendProtocol string) (*websocket.Conn, error) {
	w := x.responseWriter()   // the upgrade hijacks the connection
	hdr := w.Header().Clone() // request id, region, rate-limit headers
	proto := backendProtocol
	if proto == "" && ws.Offers(x.r, ws.SubprotocolV1) {
		proto = ws.SubprotocolV1
	}
	if proto != "" {
		hdr.Set("Sec-Websocket-Protocol", proto)
	}
	u := ws.NewUpgrader(nil, WriteHandshakeError)
	u.Error = func(w http.ResponseWriter, r *http.Request, status int, reason error) {
		x.status = status
		WriteError(w, handshakeError(status, reason))
	}
	conn, err := u.Upgrade(w, x.r, hdr)
	if err == nil {
		x.status = http.StatusSwitchingProtocols
	}
	return conn, err
}

// WriteHandshakeError answers a failed WebSocket upgrade with status and
// reason as a JSON error (code bad_websocket_handshake); it has the shape
// of ws.NewUpgrader's error callback.
func WriteHandshakeError(w http.ResponseWriter, status int, reason error) {
	WriteError(w, handshakeError(status, reason))
}

// handshakeError is the JSON error for a failed upgrade.
func handshakeError(status int, reason error) *APIError {
	return &APIError{Status: status, Type: "invalid_request_error", Code: "bad_websocket_handshake", Message: reason.Error()}
}
