package ws

import (
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gorilla/websocket"
)

// The subprotocol a browser offers to use the bridge, and the prefix of the
// subprotocol that carries its API key (browsers cannot set headers on a
// WebSocket). Only SubprotocolV1 is ever echoed back.
const (
	SubprotocolV1     = "sluice.v1"
	subprotocolKeyPfx = "sluice.key."
)

// Close codes and timing Sluice uses beyond gorilla's constants.
const (
	// CloseBadGateway (1014, IANA registry) tells a passthrough client that
	// the backend's side of the relay failed.
	CloseBadGateway = 1014
	// CloseGrace is how long a peer has to answer Sluice's close frame.
	CloseGrace = time.Second
)

// ErrOriginNotAllowed refuses a browser's upgrade from an origin that is
// neither the request's own host nor allowed by the config.
var ErrOriginNotAllowed = errors.New("WebSocket connections from this origin are not allowed")

// NewUpgrader returns the upgrader for client sockets offering
// subprotocols. Origins are checked before the upgrade (CheckOrigin), so
// that a refusal is an error in the API's shape; onError answers a failed
// handshake.
func NewUpgrader(subprotocols []string, onError func(w http.ResponseWriter, status int, reason error)) *websocket.Upgrader {
	return &websocket.Upgrader{
		HandshakeTimeout: 10 * time.Second,
		ReadBufferSize:   4 << 10,
		WriteBufferSize:  4 << 10,
		Subprotocols:     subprotocols,
		CheckOrigin:      func(*http.Request) bool { return true },
		Error: func(w http.ResponseWriter, _ *http.Request, status int, reason error) {
			onError(w, status, reason)
		},
	}
}

// CheckOrigin refuses, with ErrOriginNotAllowed, browser requests from
// origins that are neither the request's own host nor listed in allowed.
// Requests without an Origin header (non-browser clients) pass.
func CheckOrigin(r *http.Request, allowed []string) error {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return nil
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return ErrOriginNotAllowed
	}
	if strings.EqualFold(u.Host, r.Host) {
		return nil
	}
	for _, a := range allowed {
		if originMatches(a, u) {
			return nil
		}
	}
	return ErrOriginNotAllowed
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

// SubprotocolKey returns the API key a browser sends as the subprotocol
// "sluice.key.<key>", or "".
func SubprotocolKey(r *http.Request) string {
	for _, p := range websocket.Subprotocols(r) {
		if k, ok := strings.CutPrefix(p, subprotocolKeyPfx); ok && k != "" {
			return k
		}
	}
	return ""
}

// Offers reports whether the client offered subprotocol p.
func Offers(r *http.Request, p string) bool {
	for _, q := range websocket.Subprotocols(r) {
		if q == p {
			return true
		}
	}
	return false
}

// Linger reads and discards what the peer still sends (the rest of an
// oversized message, its close frame) for up to CloseGrace, so that closing
// the socket does not reset it before the peer has read the close frame.
func Linger(c *websocket.Conn) {
	nc := c.NetConn()
	nc.SetReadDeadline(time.Now().Add(CloseGrace))
	io.CopyN(io.Discard, nc, 4<<20)
}

// CloseMessage formats a close frame; text is cut to fit a control frame.
func CloseMessage(code int, text string) []byte {
	if len(text) > 120 {
		text = text[:120]
	}
	return websocket.FormatCloseMessage(code, text)
}
