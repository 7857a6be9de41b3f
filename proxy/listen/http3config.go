package listen

import "time"

// HTTP3Config configures the HTTP/3 (QUIC) listener that serves beside the
// HTTPS listener. The zero value serves HTTP/3 on the HTTPS listener's port
// number over UDP with the defaults named on each field.
type HTTP3Config struct {
	// Enabled serves HTTP/3 when the HTTPS listener is configured. Nil
	// means true.
	Enabled *bool `yaml:"enabled"`
	// Addr is the UDP listen address. Empty means the HTTPS listener's
	// host and port number.
	Addr string `yaml:"addr"`
	// MaxIncomingStreams bounds the concurrent requests (bidirectional
	// streams) a client may open on one connection. Zero means 100.
	MaxIncomingStreams int64 `yaml:"max_incoming_streams"`
	// IdleTimeout closes a connection that has had no open request for
	// this long, or from which nothing was received for this long. Zero
	// means 2m.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// KeepAlive is the period at which the server sends QUIC PING frames
	// so that NAT bindings survive quiet streams (a long prefill). Zero
	// means 15s; negative means none.
	KeepAlive time.Duration `yaml:"keep_alive"`
	// Allow0RTT accepts 0-RTT (early data) from resuming clients. Early
	// data can be replayed, so only GET and HEAD requests are served from
	// it (forwarded with "Early-Data: 1"); others get 425 Too Early and the
	// client retries after the handshake. Default false.
	Allow0RTT bool `yaml:"allow_0rtt"`
	// MaxConnsPerAddr caps the QUIC connections (handshaking or
	// established) one client IP address may hold; more are refused with
	// CONNECTION_REFUSED. Zero means 1024.
	MaxConnsPerAddr int `yaml:"max_conns_per_addr"`
	// MaxHandshakes caps the QUIC handshakes in progress on the node;
	// more are refused with CONNECTION_REFUSED. Once half of it is in
	// use, new clients must first prove their address with a Retry (one
	// more round trip), so that spoofed source addresses cannot fill it.
	// Zero means 1024.
	MaxHandshakes int `yaml:"max_handshakes"`
	// MaxHandshakesPerAddr caps the QUIC handshakes in progress from one
	// client IP address, so that one client cannot take all of
	// MaxHandshakes; more are refused with CONNECTION_REFUSED. Zero means
	// 64.
	MaxHandshakesPerAddr int `yaml:"max_handshakes_per_addr"`
}

// Defaults of HTTP3Config.
const (
	DefaultHTTP3MaxStreams        = 100
	DefaultHTTP3IdleTimeout       = 2 * time.Minute
	DefaultHTTP3KeepAlive         = 15 * time.Second
	DefaultHTTP3ConnsPerAddr      = 1024
	DefaultHTTP3Handshakes        = 1024
	DefaultHTTP3HandshakesPerAddr = 64
)

// altSvcMaxAge is how long (seconds) clients may remember the h3 endpoint.
const altSvcMaxAge = 86400

// On reports whether HTTP/3 is enabled.
func (c HTTP3Config) On() bool { return c.Enabled == nil || *c.Enabled }

// WithDefaults returns c with zero fields set to their defaults.
func (c HTTP3Config) WithDefaults() HTTP3Config {
	if c.MaxIncomingStreams == 0 {
		c.MaxIncomingStreams = DefaultHTTP3MaxStreams
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultHTTP3IdleTimeout
	}
	if c.KeepAlive == 0 {
		c.KeepAlive = DefaultHTTP3KeepAlive
	}
	if c.MaxConnsPerAddr == 0 {
		c.MaxConnsPerAddr = DefaultHTTP3ConnsPerAddr
	}
	if c.MaxHandshakes == 0 {
		c.MaxHandshakes = DefaultHTTP3Handshakes
	}
	if c.MaxHandshakesPerAddr == 0 {
		c.MaxHandshakesPerAddr = DefaultHTTP3HandshakesPerAddr
	}
	return c
}
