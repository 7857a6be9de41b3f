package listen_test

import (
	"crypto/tls"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/proxy/listen"
)

// A TLS-ALPN-01 validation (ALPN "acme-tls/1", RFC 8737) is over once its
// handshake is: the connection is closed at once, not left waiting for a
// request until the first-request timeout. (net/http closes a connection
// whose negotiated protocol has no TLSNextProto entry: server.go, conn.serve,
// Go 1.26; this test keeps that true for the listener as wired.)
func TestACMETLSALPNConnClosedAfterHandshake(t *testing.T) {
	s := startTLS(t, func(s *listen.Server) {
		s.TLSConfig.NextProtos = append(s.TLSConfig.NextProtos, "acme-tls/1")
	})
	c, err := tls.Dial("tcp", s.Addr(listen.ListenerHTTPS), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"acme-tls/1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if p := c.ConnectionState().NegotiatedProtocol; p != "acme-tls/1" {
		t.Fatalf("negotiated %q; want acme-tls/1", p)
	}
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	_, err = c.Read(make([]byte, 1))
	if !errors.Is(err, io.EOF) {
		t.Fatalf("read after an acme-tls/1 handshake: %v after %v; want EOF (closed by the server)", err, time.Since(start))
	}

	// h2 on the same listener is served as before.
	dialH2(t, s.Addr(listen.ListenerHTTPS))
}
