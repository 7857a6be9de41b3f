package loadgen

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/quic-go/quic-go/http3"
)

// requester sends one job and fills in its result. Implementations are
// safe for simultaneous use by multiple goroutines.
type requester interface {
	do(ctx context.Context, j *job, res *Result)
	close() error
}

// errPinMismatch is returned by the TLS handshake when the server's public
// key does not match Config.PinSHA256.
var errPinMismatch = errors.New("server public key does not match the pin")

// newRequester builds the client for one target.
func newRequester(c Config, target string, p Protocol, noKeepAlive bool) (requester, error) {
	tc, err := clientTLS(c)
	if err != nil {
		return nil, err
	}
	header, err := requestHeader(c)
	if err != nil {
		return nil, err
	}
	if p == WS {
		return newWSRequester(c, target, tc, header)
	}
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("parsing target: %w", err)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + c.Path
	// Sluice sends its final Server-Timing trailer only to clients that
	// ask for trailers.
	header.Set("TE", "trailers")
	h := &httpRequester{url: u.String(), header: header}
	if p == H3 {
		t3 := &http3.Transport{TLSClientConfig: tc, DisableCompression: true}
		h.rt, h.closeFn = t3, t3.Close
		return h, nil
	}
	tr := httpTransport(p, tc)
	tr.DisableKeepAlives = noKeepAlive
	h.rt = tr
	h.closeFn = func() error { tr.CloseIdleConnections(); return nil }
	return h, nil
}

// httpTransport is an http.Transport tuned for load generation: no
// compression, no proxy from the environment, idle connections kept for
// every concurrent stream, only the chosen protocol.
func httpTransport(p Protocol, tc *tls.Config) *http.Transport {
	var ps http.Protocols
	switch p {
	case H2:
		ps.SetHTTP2(true)
	case H2C:
		ps.SetUnencryptedHTTP2(true)
	default:
		ps.SetHTTP1(true)
	}
	return &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     tc,
		TLSHandshakeTimeout: 10 * time.Second,
		DisableCompression:  true,
		MaxIdleConnsPerHost: 1 << 20, // as many as were ever concurrent
		IdleConnTimeout:     90 * time.Second,
		ReadBufferSize:      4 << 10, // small: thousands of idle streams must fit
		WriteBufferSize:     4 << 10,
		Protocols:           &ps,
	}
}

// clientTLS builds the client TLS configuration from the Config options.
func clientTLS(c Config) (*tls.Config, error) {
	tc := &tls.Config{InsecureSkipVerify: c.Insecure} //nolint:gosec // an explicit option
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("reading ca file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca file %s: no PEM certificates", c.CAFile)
		}
		tc.RootCAs = pool
	}
	if c.PinSHA256 != "" {
		pin, err := decodePin(c.PinSHA256)
		if err != nil {
			return nil, err
		}
		tc.InsecureSkipVerify = true // the pin replaces chain verification
		tc.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errPinMismatch
			}
			sum := sha256.Sum256(cs.PeerCertificates[0].RawSubjectPublicKeyInfo)
			if !bytes.Equal(sum[:], pin) {
				return fmt.Errorf("%w (got %s)", errPinMismatch, base64.StdEncoding.EncodeToString(sum[:]))
			}
			return nil
		}
	}
	return tc, nil
}

// decodePin reads a SHA-256 pin in base64 (optionally "sha256/"-prefixed)
// or hex.
func decodePin(s string) ([]byte, error) {
	s = strings.TrimPrefix(strings.TrimSpace(s), "sha256/")
	for _, dec := range []func(string) ([]byte, error){
		base64.StdEncoding.DecodeString, base64.RawStdEncoding.DecodeString,
		base64.URLEncoding.DecodeString, hex.DecodeString,
	} {
		if b, err := dec(s); err == nil && len(b) == sha256.Size {
			return b, nil
		}
	}
	return nil, fmt.Errorf("%q is not a base64 or hex SHA-256", s)
}

// requestHeader builds the headers sent with every request.
func requestHeader(c Config) (http.Header, error) {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "sluice-bench")
	if !c.NoStream {
		h.Set("Accept", "text/event-stream")
	}
	h.Set("TE", "trailers") // ask for the Server-Timing trailer on HTTP/1.1
	if c.APIKey != "" {
		h.Set("Authorization", "Bearer "+c.APIKey)
	}
	for _, kv := range c.Headers {
		name, value, ok := strings.Cut(kv, ":")
		if !ok || strings.TrimSpace(name) == "" {
			return nil, fmt.Errorf("header %q is not \"Name: value\"", kv)
		}
		h.Add(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	return h, nil
}
