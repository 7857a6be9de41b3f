package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/sluice-proxy/sluice/proxy/h1up"
	"github.com/sluice-proxy/sluice/routing"
)

// NewPoolTransport returns the transport for one pool's backends: a
// PoolTransport whose net/http side has NewTransport's settings plus the
// pool's upstream TLS (trusted CAs, client certificate for mutual TLS,
// server name) and its HTTP/2 choice (ALPN "h2" to https:// backends; h2c
// with prior knowledge to http:// ones). With h2c on, HTTP/1.1 is not
// offered at all, so https:// backends of the same pool must speak HTTP/2
// too. Plaintext HTTP/1.1 (http:// backends, h2c off, http2 auto or off)
// goes on Sluice's own client, h1up, whose connections a committed stream
// can take over, unless http1_client is net_http. The files are read
// once, here.
func NewPoolTransport(cfg Config, pc routing.PoolConfig) (*PoolTransport, error) {
	t := NewTransport(cfg)
	tlsCfg, err := UpstreamTLSConfig(pc.TLS)
	if err != nil {
		return nil, fmt.Errorf("pool %q: %w", pc.Name, err)
	}
	t.TLSClientConfig = tlsCfg
	var p http.Protocols
	switch pc.HTTP2 {
	case "", routing.HTTP2Auto:
		p.SetHTTP1(true)
		p.SetHTTP2(true)
	case routing.HTTP2On:
		p.SetHTTP2(true)
	case routing.HTTP2Off:
		p.SetHTTP1(true)
	default:
		return nil, fmt.Errorf("pool %q: http2 %q: want auto, on or off", pc.Name, pc.HTTP2)
	}
	if pc.H2C {
		if pc.HTTP2 == routing.HTTP2Off {
			return nil, fmt.Errorf("pool %q: h2c needs http2 other than off", pc.Name)
		}
		p.SetHTTP1(false) // with HTTP/1 offered, http:// requests would use it
		p.SetUnencryptedHTTP2(true)
	}
	t.Protocols = &p
	pt := &PoolTransport{Std: t}
	switch pc.HTTP1Client {
	case "", routing.HTTP1ClientOwn:
		if !pc.H2C && pc.HTTP2 != routing.HTTP2On {
			pt.H1 = NewH1Transport(cfg)
		}
	case routing.HTTP1ClientNetHTTP:
	default:
		return nil, fmt.Errorf("pool %q: http1_client %q: want own or net_http", pc.Name, pc.HTTP1Client)
	}
	return pt, nil
}

// NewH1Transport returns Sluice's own HTTP/1.1 client with NewTransport's
// settings: dial timeout, 90s idle timeout, 1024 idle connections per
// backend and 4 KiB read buffers. No spare is dialed when a stream takes
// its connection to the event loop (Options.SpareOnDetach): the loop gives
// the connection back to the idle pool when the stream ends cleanly.
func NewH1Transport(cfg Config) *h1up.Transport {
	cfg = cfg.WithDefaults()
	return h1up.New(h1up.Options{
		DialTimeout:         cfg.DialTimeout,
		IdleConnTimeout:     90 * time.Second,
		MaxIdleConnsPerHost: 1024,
		ReadBufferSize:      4 << 10,
	})
}

// PoolTransport carries one pool's requests: http:// ones on H1 when it is
// set, everything else (https://, h2c) on Std. It is safe for simultaneous
// use by multiple goroutines.
type PoolTransport struct {
	// H1 is Sluice's own HTTP/1.1 client for http:// requests. Nil when
	// the pool's settings need net/http for them (h2c, http2: on).
	H1 *h1up.Transport
	// Std is net/http's transport, with the pool's TLS config.
	Std *http.Transport
}

var _ http.RoundTripper = (*PoolTransport)(nil)

// RoundTrip sends req on H1 when it is a plaintext request H1 carries,
// else on Std.
func (t *PoolTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.H1 != nil && req.URL != nil && req.URL.Scheme == "http" {
		return t.H1.RoundTrip(req)
	}
	return t.Std.RoundTrip(req)
}

// CloseIdleConnections closes both clients' idle connections.
func (t *PoolTransport) CloseIdleConnections() {
	if t.H1 != nil {
		t.H1.CloseIdleConnections()
	}
	t.Std.CloseIdleConnections()
}

// StdTransport is the net/http side: routing.Pool.UseTransport clones it
// for health probes and scrapes, so they keep connections of their own.
func (t *PoolTransport) StdTransport() *http.Transport { return t.Std }

// stdTransport is rt's net/http transport, if it has one: a
// PoolTransport's Std or rt itself.
func stdTransport(rt http.RoundTripper) *http.Transport {
	switch t := rt.(type) {
	case *http.Transport:
		return t
	case *PoolTransport:
		return t.Std
	}
	return nil
}

// UpstreamTLSConfig builds the client TLS config for a pool's backends. A
// nil u gives nil: Go's defaults (system roots, no client certificate).
func UpstreamTLSConfig(u *routing.UpstreamTLS) (*tls.Config, error) {
	if u == nil {
		return nil, nil
	}
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         u.ServerName,
		InsecureSkipVerify: u.InsecureSkipVerify,
	}
	if u.CAFile != "" {
		pool, err := LoadCAFile(u.CAFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	switch {
	case u.CertFile != "" && u.KeyFile != "":
		pair, err := tls.LoadX509KeyPair(u.CertFile, u.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	case u.CertFile != "" || u.KeyFile != "":
		return nil, fmt.Errorf("client certificate: set both cert_file and key_file")
	}
	return cfg, nil
}

// maxCAFile bounds a CA file (a bundle of every public root is ~250 KiB).
const maxCAFile = 4 << 20

// LoadCAFile reads a PEM bundle of CA certificates. A file without any
// certificate is an error.
func LoadCAFile(name string) (*x509.CertPool, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("ca file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxCAFile+1))
	if err != nil {
		return nil, fmt.Errorf("ca file: %w", err)
	}
	if len(data) > maxCAFile {
		return nil, fmt.Errorf("ca file %q: larger than %d bytes", name, maxCAFile)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("ca file %q: no PEM certificates in it", name)
	}
	return pool, nil
}

// transport is the round tripper for the route's pool: the pool's own when
// the state has one, else the handler's.
func (x *exchange) transport() http.RoundTripper {
	if t := x.st.Transports[x.route.Pool.Name()]; t != nil {
		return t
	}
	return x.h.transport
}
