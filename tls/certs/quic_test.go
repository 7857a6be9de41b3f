package certs

import (
	"context"
	"crypto/tls"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

func TestQUICConfig(t *testing.T) {
	f := newSNIFixture(t)
	qc := f.store.QUICConfig()
	if qc.MinVersion != tls.VersionTLS13 {
		t.Errorf("QUIC MinVersion %s; want TLS 1.3", tls.VersionName(qc.MinVersion))
	}
	if len(qc.NextProtos) != 1 || qc.NextProtos[0] != http3.NextProtoH3 {
		t.Errorf("QUIC NextProtos %v; want [h3]", qc.NextProtos)
	}
	addr := serveQUIC(t, qc)
	for _, tc := range []struct{ sni, want string }{
		{"api.example.com", "exact"},
		{"x.example.com", "wildcard"},
		{"", "ip"}, // quic-go passes the local address on to GetCertificate
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := quic.DialAddr(ctx, addr, &tls.Config{
			ServerName: tc.sni, RootCAs: f.ca.pool, NextProtos: []string{http3.NextProtoH3},
			InsecureSkipVerify: tc.sni == ""}, nil)
		cancel()
		if err != nil {
			t.Fatalf("QUIC handshake, SNI %q: %v", tc.sni, err)
		}
		st := conn.ConnectionState().TLS
		if got := st.PeerCertificates[0].Subject.CommonName; got != tc.want {
			t.Errorf("QUIC SNI %q: got %q; want %q", tc.sni, got, tc.want)
		}
		if st.NegotiatedProtocol != "h3" || st.Version != tls.VersionTLS13 {
			t.Errorf("QUIC: ALPN %q, %s; want h3, TLS 1.3", st.NegotiatedProtocol, tls.VersionName(st.Version))
		}
		_ = conn.CloseWithError(0, "")
	}
}

// serveQUIC accepts QUIC connections on 127.0.0.1 until the test ends.
func serveQUIC(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := quic.ListenAddr("127.0.0.1:0", cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			conn, err := ln.Accept(ctx)
			if err != nil {
				if !errors.Is(err, context.Canceled) && !errors.Is(err, quic.ErrServerClosed) {
					t.Errorf("QUIC accept: %v", err)
				}
				return
			}
			wg.Go(func() {
				<-conn.Context().Done()
			})
		}
	})
	t.Cleanup(func() {
		cancel()
		ln.Close()
		wg.Wait()
	})
	return ln.Addr().String()
}
