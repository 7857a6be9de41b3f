package proxy

import (
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// The subprotocol a browser offers to use the bridge, and the prefix of the
// subprotocol that carries its API key (browsers cannot set headers on a
// WebSocket). Only subprotocolV1 is ever echoed back.
const (
	subprotocolV1  = "sluice.v1"
	subprotocolKey = "sluice.key."
)

// ProtoWS is listen.ConnInfo.Proto (and the proto label of metrics and
// the access log) for requests made over the WebSocket bridge.
const ProtoWS = "ws"

// Close codes Sluice sends beyond gorilla's constants.
const (
	// closeBadGateway (1014, IANA registry) tells a passthrough client that
	// the backend's side of the relay failed.
	closeBadGateway = 1014
	// closeGrace is how long a peer has to answer Sluice's close frame.
	closeGrace = time.Second
)

var (
	errSlowClient = errors.New("client did not read frames in time")
	errConnGone   = errors.New("websocket connection closed")
)

func newUpgrader(subprotocols []string) *websocket.Upgrader {
	return &websocket.Upgrader{
		HandshakeTimeout: 10 * time.Second,
		ReadBufferSize:   4 << 10,
		WriteBufferSize:  4 << 10,
		Subprotocols:     subprotocols,
		// Origins are checked before the upgrade (checkOrigin) so that a
		// refusal is an OpenAI-shaped JSON error.
		CheckOrigin: func(*http.Request) bool { return true },
		Error: func(w http.ResponseWriter, _ *http.Request, status int, reason error) {
			writeError(w, handshakeError(status, reason))
		},
	}
}

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

// checkOrigin refuses browser requests from origins that are neither the
// request's own host nor listed in allowed. Requests without an Origin
// header (non-browser clients) pass.
func checkOrigin(r *http.Request, allowed []string) error {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return nil
	}
	refused := &apiError{Status: http.StatusForbidden, Type: "invalid_request_error", Code: "origin_not_allowed",
		Message: "WebSocket connections from this origin are not allowed"}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return refused
	}
	if strings.EqualFold(u.Host, r.Host) {
		return nil
	}
	for _, a := range allowed {
		if originMatches(a, u) {
			return nil
		}
	}
	return refused
}

// originMatches reports whether pattern ("*", "https://a.b:8443",
// "https://*.b") matches the parsed origin u.
func originMatches(pattern string, u *url.URL) bool {
	if pattern == "*" {
		return true
	}
	p, err := url.Parse(pattern)
	if err != nil || !strings.EqualFold(p.Scheme, u.Scheme) {
		return false
	}
	if suffix, ok := strings.CutPrefix(p.Host, "*"); ok {
		host := strings.ToLower(u.Host)
		return strings.HasSuffix(host, strings.ToLower(suffix)) && len(host) > len(suffix)
	}
	return strings.EqualFold(p.Host, u.Host)
}

// ValidOrigin reports whether s is an allowed_origins entry: "*", or
// scheme://host[:port] with scheme http or https and no path, where host
// may start with "*." for any subdomain.
func ValidOrigin(s string) bool {
	if s == "*" {
		return true
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return false
	}
	host := u.Host
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		host = rest
	}
	return host != "" && !strings.Contains(host, "*")
}

// wsKey extracts the API key of a WebSocket upgrade: Authorization: Bearer,
// x-api-key, or the subprotocol "sluice.key.<key>". fromProtocol tells that
// it came from the subprotocol.
func wsKey(r *http.Request) (key string, fromProtocol bool) {
	if k := apiKey(r, false); k != "" {
		return k, false
	}
	for _, p := range websocket.Subprotocols(r) {
		if k, ok := strings.CutPrefix(p, subprotocolKey); ok && k != "" {
			return k, true
		}
	}
	return "", false
}

// offers reports whether the client offered subprotocol p.
func offers(r *http.Request, p string) bool {
	for _, q := range websocket.Subprotocols(r) {
		if q == p {
			return true
		}
	}
	return false
}

// linger reads and discards what the peer still sends (the rest of an
// oversized message, its close frame) for up to closeGrace, so that closing
// the socket does not reset it before the peer has read the close frame.
func linger(c *websocket.Conn) {
	nc := c.NetConn()
	nc.SetReadDeadline(time.Now().Add(closeGrace))
	io.CopyN(io.Discard, nc, 4<<20)
}

// closeMessage formats a close frame; text is cut to fit a control frame.
func closeMessage(code int, text string) []byte {
	if len(text) > 120 {
		text = text[:120]
	}
	return websocket.FormatCloseMessage(code, text)
}
