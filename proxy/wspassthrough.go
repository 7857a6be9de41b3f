package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/gorilla/websocket"

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
		return &apiError{Status: http.StatusUpgradeRequired, Type: "invalid_request_error", Code: "upgrade_required",
			Message: "this route relays WebSocket: send GET with Upgrade: websocket"}
	}
	if err := checkOrigin(r, cfg.AllowedOrigins); err != nil {
		return err
	}
	if err := x.admit(); err != nil {
		return err
	}
	backend, end, err := x.dialAny()
	if err != nil {
		return err
	}
	defer end()
	client, err := x.upgradeClient(backend.Subprotocol())
	if err != nil {
		backend.WriteControl(websocket.CloseMessage, closeMessage(websocket.CloseGoingAway, "client upgrade failed"),
			time.Now().Add(closeGrace))
		backend.Close()
		return err
	}
	x.firstToken = time.Now()
	x.h.metrics.wsOpen(wsModePassthrough, 1)
	defer x.h.metrics.wsOpen(wsModePassthrough, -1)
	err = x.relayFrames(client, backend, cfg)
	x.lastToken = time.Now()
	return err
}

// dialAny dials a backend of the route's pool, trying others (up to the
// route's retries) when one cannot be reached or refuses the upgrade.
func (x *exchange) dialAny() (*websocket.Conn, func(), error) {
	retries := *x.st.Config.Retries
	if x.route.Retries != nil {
		retries = *x.route.Retries
	}
	var tried []*routing.Backend
	var lastErr error
	for attempt := 0; attempt <= retries; attempt++ {
		b, err := x.pickNext(attempt, tried)
		if err != nil {
			if lastErr != nil {
				break
			}
			return nil, nil, err
		}
		tried = append(tried, b)
		x.backend = b
		end := b.Begin()
		conn, err := x.dialBackend(b)
		if err == nil {
			x.upstreamHeaders = time.Now()
			b.Report(true, x.upstreamHeaders)
			return conn, end, nil
		}
		end()
		if x.r.Context().Err() != nil {
			return nil, nil, err
		}
		b.Report(false, time.Now())
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
	if x.route.FirstTokenTimeout > 0 {
		timeout = x.route.FirstTokenTimeout
	}
	d := &websocket.Dialer{
		NetDialContext:   (&net.Dialer{Timeout: x.st.Config.DialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		HandshakeTimeout: timeout,
		ReadBufferSize:   4 << 10,
		WriteBufferSize:  4 << 10,
		Subprotocols:     protocols,
		TLSClientConfig:  x.upstreamTLS(),
	}
	conn, resp, err := d.DialContext(x.r.Context(), x.backendURL(b), x.backendHeader())
	if resp != nil && resp.Body != nil {
		discard(resp.Body, 4<<10)
		resp.Body.Close()
	}
	switch {
	case err == nil:
		return conn, nil
	case resp != nil:
		return nil, &apiError{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_refused_upgrade",
			Message: fmt.Sprintf("the backend answered %d to the WebSocket upgrade", resp.StatusCode)}
	}
	return nil, err
}

// upstreamTLS is the client TLS config for a wss:// backend: the pool's
// (trusted CAs, client certificate, server name), offering only HTTP/1.1,
// the protocol a WebSocket handshake needs.
func (x *exchange) upstreamTLS() *tls.Config {
	cfg := &tls.Config{}
	if t, ok := x.transport().(*http.Transport); ok && t.TLSClientConfig != nil {
		cfg = t.TLSClientConfig.Clone()
	}
	cfg.NextProtos = []string{"http/1.1"}
	return cfg
}

// backendURL is the backend's WebSocket URL for the client's request.
func (x *exchange) backendURL(b *routing.Backend) string {
	r := x.r
	u := *b.URL
	u.Scheme = "ws"
	if b.URL.Scheme == "https" {
		u.Scheme = "wss"
	}
	u.Path = strings.TrimSuffix(b.URL.Path, "/") + r.URL.Path
	u.RawPath = ""
	u.RawQuery = r.URL.RawQuery
	if x.route.AllowQueryKey && u.RawQuery != "" {
		q := r.URL.Query()
		q.Del(queryKeyParam)
		u.RawQuery = q.Encode()
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
	if proto == "" && offers(x.r, subprotocolV1) {
		proto = subprotocolV1
	}
	if proto != "" {
		hdr.Set("Sec-Websocket-Protocol", proto)
	}
	u := newUpgrader(nil)
	u.Error = func(w http.ResponseWriter, r *http.Request, status int, reason error) {
		x.status = status
		writeError(w, handshakeError(status, reason))
	}
	conn, err := u.Upgrade(w, x.r, hdr)
	if err == nil {
		x.status = http.StatusSwitchingProtocols
	}
	return conn, err
}

// side names one end of a passthrough relay.
type side int

const (
	sideClient side = iota
	sideBackend
)

// pumpEnd is how one direction of a relay ended: which side failed or
// closed, and why.
type pumpEnd struct {
	side  side
	err   error
	bytes int64 // relayed to the destination
}

// relayFrames copies frames both ways, one goroutine per direction, and
// pings both sides. When one side closes or fails, the other is sent the
// matching close frame, given closeGrace to answer, and both are closed.
func (x *exchange) relayFrames(client, backend *websocket.Conn, cfg WebSocketConfig) error {
	rl := &wsRelay{conns: [2]*websocket.Conn{sideClient: client, sideBackend: backend}, ends: make(chan pumpEnd, 2)}
	for _, c := range rl.conns {
		c.SetReadLimit(int64(cfg.MaxMessageBytes))
		c.SetPongHandler(func(string) error { return c.SetReadDeadline(time.Now().Add(cfg.liveness())) })
	}
	stop := make(chan struct{})
	defer close(stop)
	go pumpFrames(client, backend, sideClient, cfg.liveness(), rl.ends)
	go pumpFrames(backend, client, sideBackend, cfg.liveness(), rl.ends)
	go keepalive(stop, cfg.PingInterval, cfg.liveness(), client, backend)

	var err error
	select {
	case first := <-rl.ends:
		rl.take(first)
		rl.forward(first)
		err = first.err
	case <-x.r.Context().Done(): // the server stops: drain time is over
		err = context.Cause(x.r.Context())
		msg := closeMessage(websocket.CloseGoingAway, "server shutting down")
		for _, c := range rl.conns {
			c.WriteControl(websocket.CloseMessage, msg, time.Now().Add(closeGrace))
		}
	}
	rl.finish()
	x.bytesToUser += rl.relayed
	if cleanClose(err) {
		return nil
	}
	return err
}

// wsRelay is a running passthrough relay: its two connections and the
// ends of its two directions.
type wsRelay struct {
	conns    [2]*websocket.Conn // by side
	ends     chan pumpEnd
	received int
	relayed  int64 // bytes relayed to the client
}

func (rl *wsRelay) take(e pumpEnd) {
	rl.received++
	rl.relayed += e.bytes
}

// forward sends the other side the close frame that matches how e ended.
func (rl *wsRelay) forward(e pumpEnd) {
	code, text := forwardClose(e)
	rl.conns[1-e.side].WriteControl(websocket.CloseMessage, closeMessage(code, text), time.Now().Add(closeGrace))
	if errors.Is(e.err, websocket.ErrReadLimit) {
		linger(rl.conns[e.side]) // gorilla has sent it 1009; let that arrive
	}
}

// finish gives the directions still running closeGrace to end (each side
// answering its close frame), then closes both connections and waits.
func (rl *wsRelay) finish() {
	t := time.NewTimer(closeGrace)
	defer t.Stop()
wait:
	for rl.received < 2 {
		select {
		case e := <-rl.ends:
			rl.take(e)
		case <-t.C:
			break wait
		}
	}
	for _, c := range rl.conns {
		c.Close()
	}
	for rl.received < 2 {
		rl.take(<-rl.ends)
	}
}

var errWriteFailed = errors.New("write failed")

// pumpFrames copies messages from src to dst until either fails. from is
// src's side; a failed write is reported as the other side's failure.
func pumpFrames(src, dst *websocket.Conn, from side, liveness time.Duration, ends chan<- pumpEnd) {
	var n int64
	for {
		src.SetReadDeadline(time.Now().Add(liveness))
		mt, msg, err := src.ReadMessage()
		if err != nil {
			ends <- pumpEnd{side: from, err: err, bytes: n}
			return
		}
		dst.SetWriteDeadline(time.Now().Add(liveness))
		if err := dst.WriteMessage(mt, msg); err != nil {
			ends <- pumpEnd{side: 1 - from, err: fmt.Errorf("%w: %w", errWriteFailed, err), bytes: n}
			return
		}
		if from == sideBackend {
			n += int64(len(msg))
		}
	}
}

// keepalive pings every connection each interval until stop is closed.
func keepalive(stop <-chan struct{}, interval, liveness time.Duration, conns ...*websocket.Conn) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			for _, c := range conns {
				c.WriteControl(websocket.PingMessage, nil, time.Now().Add(liveness))
			}
		}
	}
}

// forwardClose is the close frame the other side gets when e.side closed
// or failed: the same code for a clean close, 1009 for an oversized
// message, else 1001 (the client went away) or 1014 (the backend failed).
func forwardClose(e pumpEnd) (int, string) {
	var ce *websocket.CloseError
	if errors.As(e.err, &ce) && ce.Code != websocket.CloseAbnormalClosure && ce.Code != websocket.CloseTLSHandshake {
		return ce.Code, ce.Text
	}
	if errors.Is(e.err, websocket.ErrReadLimit) {
		return websocket.CloseMessageTooBig, "message too big"
	}
	if e.side == sideBackend {
		return closeBadGateway, "backend connection failed"
	}
	return websocket.CloseGoingAway, "client went away"
}

// cleanClose reports whether a relay ended by an ordinary close.
func cleanClose(err error) bool {
	return websocket.IsCloseError(err, websocket.CloseNormalClosure, websocket.CloseGoingAway, websocket.CloseNoStatusReceived)
}

// handshakeError is the JSON error for a failed upgrade.
func handshakeError(status int, reason error) *apiError {
	return &apiError{Status: status, Type: "invalid_request_error", Code: "bad_websocket_handshake", Message: reason.Error()}
}
