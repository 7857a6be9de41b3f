package proxy

import (
	"context"
	"time"
)

// ConnInfo holds facts about the connection a request arrived on.
// (Placeholder until the HTTP/3 work provides the real one.)
type ConnInfo struct {
	// Proto is "h1", "h2" or "h3".
	Proto string
	// Handshake is the TLS or QUIC handshake duration, set only for the
	// first request of a connection.
	Handshake time.Duration
	// RTT returns the transport's current round-trip estimate; nil when
	// unknown.
	RTT func() time.Duration
}

// ConnInfoFrom returns the connection facts stored on a request context.
func ConnInfoFrom(ctx context.Context) (ConnInfo, bool) {
	ci, ok := ctx.Value(connInfoKey{}).(ConnInfo)
	return ci, ok
}

type connInfoKey struct{}
