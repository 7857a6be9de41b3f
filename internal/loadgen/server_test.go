package loadgen

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go/http3"
)

// sseServer is a small OpenAI-compatible streaming server for tests: it
// answers /v1/chat/completions with a role chunk, max_tokens content
// chunks, a usage chunk and [DONE], plus Server-Timing headers, an
// optional Server-Timing trailer and an optional ": server-timing" comment.
type sseServer struct {
	Interval   time.Duration // between tokens
	DieAfter   int           // > 0: abort the stream after this many tokens
	ErrorAfter int           // > 0: send an error event after this many tokens
	Status     int           // != 0: answer with this status and an error body
	Trailer    bool          // send the Server-Timing trailer
	Comment    bool          // send the ": server-timing" comment before [DONE]
	NoUsage    bool          // omit the usage chunk

	requests  atomic.Int64
	lastProto atomic.Value // string
}

func (s *sseServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	s.lastProto.Store(r.Proto)
	var body requestBody
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, `{"error":{"message":"bad json"}}`, http.StatusBadRequest)
		return
	}
	if s.Status != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(s.Status)
		fmt.Fprintf(w, `{"error":{"message":"status %d from test server","type":"test"}}`, s.Status)
		return
	}
	if !body.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":%d}}`, body.MaxTokens)
		return
	}
	s.stream(r.Context(), w, body.MaxTokens)
}

func (s *sseServer) stream(ctx context.Context, w http.ResponseWriter, n int) {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Request-Id", fmt.Sprintf("req-%d", s.requests.Load()))
	h.Set("Server-Timing", `queue;dur=1.5, prefill;dur=3;desc="prefill, 12 tokens"`)
	h.Add("Server-Timing", "ttft;dur=0.5")
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
	_ = rc.Flush()
	start := time.Now()
	for i := range n {
		if s.Interval > 0 && !sleepOrDone(ctx, s.Interval) {
			return // the client went away
		}
		if s.ErrorAfter > 0 && i == s.ErrorAfter {
			fmt.Fprint(w, "data: {\"error\":{\"message\":\"backend failed\",\"type\":\"server_error\"}}\n\n")
			_ = rc.Flush()
			return
		}
		if s.DieAfter > 0 && i == s.DieAfter {
			panic(http.ErrAbortHandler) // cut the stream without [DONE]
		}
		fmt.Fprintf(w, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d \"}}]}\n\n", i)
		_ = rc.Flush()
	}
	if !s.NoUsage {
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":%d}}\n\n", n)
	}
	decode := float64(time.Since(start).Microseconds()) / 1000
	if s.Comment {
		fmt.Fprintf(w, ": server-timing edge;dur=0.25, tokens;desc=\"%d\"\n\n", n)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	_ = rc.Flush()
	if s.Trailer {
		w.Header().Set(http.TrailerPrefix+"Server-Timing", fmt.Sprintf("decode;dur=%.3f, itl-p50;dur=1, tokens;desc=\"%d\"", decode, n))
	}
}

func sleepOrDone(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// startH1 serves s over HTTP/1.1 on a loopback port.
func startH1(t testing.TB, s *sseServer) string {
	t.Helper()
	return startH1Handler(t, s)
}

func startH1Handler(t testing.TB, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// startH2C serves s over HTTP/1.1 and cleartext HTTP/2.
func startH2C(t *testing.T, s *sseServer) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(s)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

// testCert is a self-signed certificate for 127.0.0.1 and localhost.
type testCert struct {
	tls    tls.Certificate
	caFile string // the certificate as a PEM file
	pin    string // base64 SHA-256 of its public key
}

func newTestCert(t *testing.T) testCert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "loadgen test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(leaf.RawSubjectPublicKeyInfo)
	return testCert{
		tls:    tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf},
		caFile: path,
		pin:    base64.StdEncoding.EncodeToString(sum[:]),
	}
}

// startH2 serves s over TLS with HTTP/2 and HTTP/1.1 (ALPN).
func startH2(t *testing.T, s *sseServer, cert testCert) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(s)
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert.tls}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.URL
}

// startH3 serves s over HTTP/3 on a loopback UDP port.
func startH3(t *testing.T, s *sseServer, cert testCert) string {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http3.Server{
		Handler:   s,
		TLSConfig: http3.ConfigureTLSConfig(&tls.Config{Certificates: []tls.Certificate{cert.tls}}),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(conn)
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		_ = srv.Close()
		_ = conn.Close()
		<-done
	})
	return "https://" + conn.LocalAddr().String()
}

// mustRun runs cfg and fails the test on error.
func mustRun(t *testing.T, cfg Config) *Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rep, err := Run(ctx, cfg, nil)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return rep
}

// checkOrdered asserts p50 <= p95 <= p99 <= max.
func checkOrdered(t *testing.T, name string, p Percentiles) {
	t.Helper()
	if !(p.P50 <= p.P95 && p.P95 <= p.P99 && p.P99 <= p.Max) {
		t.Errorf("%s percentiles out of order: %+v", name, p)
	}
}

// slotServer lets at most cap(slot) requests at a time into sse, like a
// GPU with a fixed batch size: the rest queue, so a sweep shows a knee.
type slotServer struct {
	sse  *sseServer
	slot chan struct{}
}

func (s *slotServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	select {
	case s.slot <- struct{}{}:
	case <-r.Context().Done():
		return
	}
	defer func() { <-s.slot }()
	s.sse.ServeHTTP(w, r)
}
