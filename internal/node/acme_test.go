package node

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go/http3"
	"golang.org/x/crypto/ocsp"
	"golang.org/x/net/dns/dnsmessage"

	"github.com/sluice-proxy/sluice/configs"
	"github.com/sluice-proxy/sluice/proxy/listen"
)

// The ACME tests run the real Pebble (github.com/letsencrypt/pebble/v2
// v2.10.3, a tool dependency in go.mod) as a subprocess on 127.0.0.1, with
// a DNS responder below that answers 127.0.0.1 for every name, so that
// Pebble's validation (HTTP-01, TLS-ALPN-01) reaches the node's listeners.

var (
	pebbleOnce sync.Once
	pebbleBin  string
	pebbleDir  string // the module's directory (its test certificates)
	pebbleErr  error
)

// buildPebble builds Pebble once per test binary.
func buildPebble(t *testing.T) (bin, dir string) {
	t.Helper()
	pebbleOnce.Do(func() {
		tmp, err := os.MkdirTemp("", "sluice-pebble-")
		if err != nil {
			pebbleErr = err
			return
		}
		pebbleBin = filepath.Join(tmp, "pebble")
		out, err := exec.Command("go", "build", "-o", pebbleBin, "github.com/letsencrypt/pebble/v2/cmd/pebble").CombinedOutput()
		if err != nil {
			pebbleErr = fmt.Errorf("building pebble: %v\n%s", err, out)
			return
		}
		out, err = exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/letsencrypt/pebble/v2").Output()
		if err != nil {
			pebbleErr = fmt.Errorf("locating pebble's module: %v", err)
			return
		}
		pebbleDir = strings.TrimSpace(string(out))
	})
	if pebbleErr != nil {
		t.Fatal(pebbleErr)
	}
	return pebbleBin, pebbleDir
}

// freePort returns a loopback port (TCP and UDP) that was free a moment ago (Pebble
// must know the node's ports before the node starts ordering).
//
// The port comes from below the kernel's ephemeral range (32768–60999 on
// Linux), as docs/benchmarks/run.sh's do: a port the kernel handed out for
// ":0" is handed out again to the next ":0" listener or outgoing
// connection of any test running in parallel, and between this pick and
// the node's bind (Pebble starts in between) one took it in a CI run
// ("bind: address already in use"). Below the range only another pick
// like this one can collide; both TCP and UDP must be free (the node may
// serve HTTP/3 on the port).
func freePort(t *testing.T) int {
	t.Helper()
	const lo, n = 20000, 12000
	start := rand.IntN(n)
	for i := range 200 {
		port := lo + (start+i*7919)%n
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		pc, err := net.ListenPacket("udp", ln.Addr().String())
		ln.Close()
		if err != nil {
			continue
		}
		pc.Close()
		return port
	}
	t.Fatal("no free loopback port below the ephemeral range")
	return 0
}

// forwardWhenReady listens on a loopback port (returned) and forwards each
// connection it accepts, byte for byte, to the address sent on the
// returned channel, waiting for it up to 30s or the test's end (a
// connection still waiting then is closed). Pebble validates TLS-ALPN-01 on that port: it reaches
// a node that started after Pebble was configured.
func forwardWhenReady(t *testing.T) (port int, to chan<- string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	ready := make(chan struct{})
	var target string
	go func() { // ends with the test: the send, or the cleanup's close
		select {
		case target = <-addr:
			close(ready)
		case <-t.Context().Done():
		}
	}()
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				select {
				case <-ready:
				case <-t.Context().Done():
					return
				case <-time.After(30 * time.Second):
					return
				}
				u, err := net.DialTimeout("tcp", target, 5*time.Second)
				if err != nil {
					return
				}
				defer u.Close()
				done := make(chan struct{})
				go func() { io.Copy(u, c); u.(*net.TCPConn).CloseWrite(); close(done) }()
				io.Copy(c, u)
				c.(*net.TCPConn).CloseWrite()
				c.SetDeadline(time.Now().Add(5 * time.Second)) // bounds the other direction
				<-done
			})
		}
	})
	return ln.Addr().(*net.TCPAddr).Port, addr
}

// startDNS answers every A question with 127.0.0.1 and every other with
// no records, over TCP (Pebble's VA resolver uses TCP: va/va.go sets
// dnsClient.Net = "tcp" when -dnsserver is given).
func startDNS(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				for {
					c.SetDeadline(time.Now().Add(10 * time.Second))
					var n [2]byte
					if _, err := io.ReadFull(c, n[:]); err != nil {
						return
					}
					q := make([]byte, binary.BigEndian.Uint16(n[:]))
					if _, err := io.ReadFull(c, q); err != nil {
						return
					}
					resp, err := dnsAnswer(q)
					if err != nil {
						return
					}
					c.Write(binary.BigEndian.AppendUint16(nil, uint16(len(resp))))
					c.Write(resp)
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func dnsAnswer(query []byte) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, err
	}
	q, err := p.Question()
	if err != nil {
		return nil, err
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired})
	b.EnableCompression()
	b.StartQuestions()
	b.Question(q)
	b.StartAnswers()
	if q.Type == dnsmessage.TypeA {
		b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AResource{A: [4]byte{127, 0, 0, 1}})
	}
	return b.Finish()
}

// pebble is a running Pebble.
type pebble struct {
	dir   string // https directory URL
	mgmt  string // https management base URL
	roots string // PEM file trusted for Pebble's own HTTPS
	log   *logBuffer
}

// startPebble runs Pebble validating HTTP-01 on httpPort and TLS-ALPN-01
// on tlsPort of 127.0.0.1. Profiles: "default" (90 days) and "shortlived"
// (20 seconds, for renewals); Pebble picks one at random for an order that
// names none, so every test names one.
//
// ocspURL, when not empty, is written into the certificates as their OCSP
// responder, and Pebble's keys are RSA (its management endpoint exports
// only RSA intermediate keys, which the test responder signs with).
func startPebble(t *testing.T, httpPort, tlsPort int, ocspURL string) *pebble {
	t.Helper()
	bin, mod := buildPebble(t)
	dns := startDNS(t)
	listenPort, mgmtPort := freePort(t), freePort(t)
	keyAlg := "ecdsa"
	if ocspURL != "" {
		keyAlg = "rsa"
	}
	cfg := map[string]any{"pebble": map[string]any{
		"listenAddress":                  "127.0.0.1:" + strconv.Itoa(listenPort),
		"managementListenAddress":        "127.0.0.1:" + strconv.Itoa(mgmtPort),
		"certificate":                    filepath.Join(mod, "test/certs/localhost/cert.pem"),
		"privateKey":                     filepath.Join(mod, "test/certs/localhost/key.pem"),
		"httpPort":                       httpPort,
		"tlsPort":                        tlsPort,
		"externalAccountBindingRequired": false,
		"retryAfter":                     map[string]int{"authz": 1, "order": 1},
		"keyAlgorithm":                   keyAlg,
		"ocspResponderURL":               ocspURL,
		"profiles": map[string]any{
			"default":    map[string]any{"description": "90 days", "validityPeriod": 7776000},
			"shortlived": map[string]any{"description": "20 seconds", "validityPeriod": 20},
		},
	}}
	b, _ := json.Marshal(cfg)
	cfgFile := filepath.Join(t.TempDir(), "pebble.json")
	if err := os.WriteFile(cfgFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	p := &pebble{
		dir:   fmt.Sprintf("https://127.0.0.1:%d/dir", listenPort),
		mgmt:  fmt.Sprintf("https://127.0.0.1:%d", mgmtPort),
		roots: filepath.Join(mod, "test/certs/pebble.minica.pem"),
		log:   &logBuffer{},
	}
	cmd := exec.Command(bin, "-config", cfgFile, "-dnsserver", dns)
	cmd.Env = append(os.Environ(), "PEBBLE_VA_NOSLEEP=1", "PEBBLE_VA_ALWAYS_VALID=0", "PEBBLE_WFE_NONCEREJECT=0", "PEBBLE_AUTHZREUSE=0")
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("pebble's log:\n%s", p.log)
		}
	})
	cl := p.client(t)
	waitUntil(t, 10*time.Second, "pebble to serve its directory", func() bool {
		resp, err := cl.Get(p.dir)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return p
}

func (p *pebble) client(t *testing.T) *http.Client {
	t.Helper()
	b, err := os.ReadFile(p.roots)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b)
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}

// root returns Pebble's issuing root (from the management endpoint), the
// trust anchor of the certificates it issues.
func (p *pebble) root(t *testing.T) *x509.CertPool {
	t.Helper()
	resp, err := p.client(t).Get(p.mgmt + "/roots/0")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		t.Fatalf("pebble's /roots/0: no PEM certificate: %q", b)
	}
	return pool
}

// orders counts the certificates Pebble logged as issued.
func (p *pebble) orders() int {
	return strings.Count(p.log.String(), "Issued certificate serial")
}

// acmeNodeConfig is a node with an https listener on httpsPort (and an
// http listener on httpPort when non-zero) getting a certificate for name.
func acmeNodeConfig(t *testing.T, p *pebble, name string, httpPort, httpsPort int, storage, extra string) *configs.Config {
	t.Helper()
	httpLine := ""
	if httpPort != 0 {
		httpLine = "  http: 127.0.0.1:" + strconv.Itoa(httpPort) + "\n"
	}
	cfgFile := filepath.Join(t.TempDir(), "sluice.yaml")
	writeFile(t, cfgFile, []byte(`listeners:
`+httpLine+`  https:
    addr: 127.0.0.1:`+strconv.Itoa(httpsPort)+`
    acme:
      email: ops@example.com
      domains: [`+name+`]
      ca: `+p.dir+`
      ca_root_file: `+p.roots+`
      storage: `+storage+`
`+extra+`  admin: 127.0.0.1:0
tenants:
  - id: demo
    keys: [sha256:1c590839af894cf25f9a5fe06929af05b377f60efbe55508ef93d251887b9213]
simulators:
  - name: gpu
    model: sim-small
    step_base: 1ms
    prefill_base: 1ms
pools:
  - name: sim
    backends: [{url: "sim://gpu"}]
routes:
  - pool: sim
`))
	cfg, err := configs.Load(cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// servedCert waits for the node at addr to serve a certificate for name
// that chains to roots over TCP TLS, and returns its leaf.
func servedCert(t *testing.T, addr, name string, roots *x509.CertPool, within time.Duration) *x509.Certificate {
	t.Helper()
	var leaf *x509.Certificate
	var last error
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		c, err := tls.Dial("tcp", addr, &tls.Config{ServerName: name, RootCAs: roots})
		if err == nil {
			leaf = c.ConnectionState().PeerCertificates[0]
			c.Close()
			return leaf
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no certificate for %s chaining to Pebble's root within %v: %v", name, within, last)
	return nil
}

// acmeRequest streams a completion over HTTP/2 (or HTTP/3) verifying the
// certificate against roots, and checks that it ends with [DONE].
func acmeRequest(t *testing.T, addr, name string, roots *x509.CertPool, h3 bool) {
	t.Helper()
	tc := &tls.Config{ServerName: name, RootCAs: roots}
	var rt http.RoundTripper
	if h3 {
		tr := &http3.Transport{TLSClientConfig: tc}
		defer tr.Close()
		rt = tr
	} else {
		var p http.Protocols
		p.SetHTTP2(true)
		tr := &http.Transport{TLSClientConfig: tc, Protocols: &p}
		defer tr.CloseIdleConnections()
		rt = tr
	}
	resp := demoRequestTokens(t, rt, "https://"+addr, 5)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	want := 2
	if h3 {
		want = 3
	}
	if resp.ProtoMajor != want || resp.StatusCode != 200 || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Fatalf("%s %d; body %q; want HTTP/%d 200 ending with [DONE]", resp.Proto, resp.StatusCode, body, want)
	}
}

func startACMENode(t *testing.T, cfg *configs.Config) (*Node, *logBuffer, func()) {
	t.Helper()
	n, logs, stop := startACMENodeNoFatal(t, cfg)
	if n == nil {
		t.FailNow()
	}
	return n, logs, stop
}

// startACMENodeNoFatal is startACMENode for other goroutines than the
// test's: on error it reports and returns a nil node.
func startACMENodeNoFatal(t *testing.T, cfg *configs.Config) (*Node, *logBuffer, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	logs := &logBuffer{}
	n, err := Start(ctx, cfg, Options{Log: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		cancel()
		t.Error(err)
		return nil, nil, nil
	}
	var once sync.Once
	stop := func() { once.Do(func() { n.Shutdown(); cancel(); n.Close() }) }
	t.Cleanup(stop)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("node's log:\n%s", logs)
		}
	})
	return n, logs, stop
}

// solved reports whether the node's log shows certmagic solving a
// challenge of type typ ("tls-alpn-01", "http-01").
func solved(logs *logBuffer, typ string) bool {
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "trying to solve challenge") && (strings.Contains(line, "challenge_type="+typ+" ") || strings.HasSuffix(line, "challenge_type="+typ)) {
			return true
		}
	}
	return false
}

// TLS-ALPN-01 on the TLS listener (acme-tls/1 offered beside h2 and
// http/1.1): the certificate chains to Pebble's root and serves HTTP/2 and
// HTTP/3; a restart on the same storage serves the same certificate
// without a new order.
func TestACMETLSALPN01ObtainsServesAndReusesStorage(t *testing.T) {
	httpsPort := freePort(t)
	p := startPebble(t, freePort(t), httpsPort, "")
	roots := p.root(t)
	storage := t.TempDir()
	cfg := acmeNodeConfig(t, p, "alpn.sluice.test", 0, httpsPort, storage, "      challenges: [tls-alpn-01]\n      profile: default\n")
	n, logs, stop := startACMENode(t, cfg)
	addr := n.Server().Addr(listen.ListenerHTTPS)
	leaf := servedCert(t, addr, "alpn.sluice.test", roots, 30*time.Second)
	if !solved(logs, "tls-alpn-01") || solved(logs, "http-01") {
		t.Fatalf("the node's log does not show a tls-alpn-01 challenge solved (alone)")
	}
	acmeRequest(t, addr, "alpn.sluice.test", roots, false)
	acmeRequest(t, addr, "alpn.sluice.test", roots, true)
	if got := p.orders(); got != 1 {
		t.Fatalf("%d certificates finalized; want 1", got)
	}
	stop()

	n2, _, _ := startACMENode(t, cfg)
	again := servedCert(t, n2.Server().Addr(listen.ListenerHTTPS), "alpn.sluice.test", roots, 10*time.Second)
	if again.SerialNumber.Cmp(leaf.SerialNumber) != 0 {
		t.Fatalf("after a restart on the same storage: serial %v; want the stored %v", again.SerialNumber, leaf.SerialNumber)
	}
	time.Sleep(500 * time.Millisecond) // an unwanted order would have started by now
	if got := p.orders(); got != 1 {
		t.Fatalf("after a restart: %d certificates finalized; want still 1 (storage reused)", got)
	}
}

// HTTP-01 on the plain http listener, answered before routing and auth.
func TestACMEHTTP01Obtains(t *testing.T) {
	httpPort, httpsPort := freePort(t), freePort(t)
	p := startPebble(t, httpPort, httpsPort, "")
	roots := p.root(t)
	cfg := acmeNodeConfig(t, p, "http.sluice.test", httpPort, httpsPort, t.TempDir(), "      challenges: [http-01]\n      profile: default\n")
	n, logs, _ := startACMENode(t, cfg)
	addr := n.Server().Addr(listen.ListenerHTTPS)
	servedCert(t, addr, "http.sluice.test", roots, 30*time.Second)
	if !solved(logs, "http-01") || solved(logs, "tls-alpn-01") {
		t.Fatalf("the node's log does not show an http-01 challenge solved (alone)")
	}
	acmeRequest(t, addr, "http.sluice.test", roots, false)
}

// A short-lived certificate is renewed in the background and the new one
// served to new handshakes without a restart.
func TestACMERenewalServedWithoutRestart(t *testing.T) {
	httpsPort := freePort(t)
	p := startPebble(t, freePort(t), httpsPort, "")
	roots := p.root(t)
	cfg := acmeNodeConfig(t, p, "renew.sluice.test", 0, httpsPort, t.TempDir(),
		"      profile: shortlived\n      renew_window_ratio: 0.7\n      check_interval: 500ms\n")
	n, _, _ := startACMENode(t, cfg)
	addr := n.Server().Addr(listen.ListenerHTTPS)
	first := servedCert(t, addr, "renew.sluice.test", roots, 30*time.Second)
	if life := first.NotAfter.Sub(first.NotBefore); life > time.Minute {
		t.Fatalf("certificate lifetime %v; want Pebble's shortlived profile (20s)", life)
	}
	waitUntil(t, 30*time.Second, "a renewed certificate to be served", func() bool {
		c := servedCert(t, addr, "renew.sluice.test", roots, 5*time.Second)
		return c.SerialNumber.Cmp(first.SerialNumber) != 0 && c.NotAfter.After(first.NotAfter)
	})
	acmeRequest(t, addr, "renew.sluice.test", roots, false)
	metrics := get(t, "http://"+n.Server().Addr(listen.ListenerAdmin)+"/metrics")
	for _, want := range []string{
		`sluice_tls_acme_certificates_obtained_total{renewal="false"} 1`,
		`sluice_tls_acme_certificates_obtained_total{renewal="true"}`,
		`sluice_tls_acme_cert_expiry_timestamp_seconds{name="renew.sluice.test"}`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// Two nodes on one storage directory (as on a shared mount): one order for
// the name, and both serve the certificate. Node B starts first and takes
// the storage lock, so B orders; but Pebble validates only node A's port,
// so the TLS-ALPN-01 challenge of B's order is answered by A from the
// shared storage. A waits for the lock and loads B's certificate.
//
// Pebble's validation port is a forwarder to A's https listener: A starts
// only once B holds the lock, and B's order (a few round trips to Pebble,
// which validates at once) could reach its validation before A listened;
// Pebble then met a refused connection, the authorization failed, and
// certmagic's next try was a minute away. The forwarder accepts at once
// and holds the validation's connection until A listens.
func TestACMESharedStorageOneOrderTwoNodes(t *testing.T) {
	validation, aAddr := forwardWhenReady(t)
	httpsB := freePort(t)
	p := startPebble(t, freePort(t), validation, "")
	roots := p.root(t)
	storage := t.TempDir()
	extra := "      challenges: [tls-alpn-01]\n      profile: default\n"
	b, logsB, _ := startACMENode(t, acmeNodeConfig(t, p, "shared.sluice.test", 0, httpsB, storage, extra))
	// B's order starts in the background: A starts once B holds the lock
	// (else A may take it first and order for itself).
	waitUntil(t, 10*time.Second, "node B to take the storage lock", func() bool {
		return strings.Contains(logsB.String(), "lock acquired")
	})
	a, logsA, _ := startACMENode(t, acmeNodeConfig(t, p, "shared.sluice.test", 0, 0, storage, extra))
	aAddr <- a.Server().Addr(listen.ListenerHTTPS)
	ca := servedCert(t, a.Server().Addr(listen.ListenerHTTPS), "shared.sluice.test", roots, 30*time.Second)
	cb := servedCert(t, b.Server().Addr(listen.ListenerHTTPS), "shared.sluice.test", roots, 30*time.Second)
	if ca.SerialNumber.Cmp(cb.SerialNumber) != 0 {
		t.Fatalf("the nodes serve serials %v and %v; want the one shared certificate", ca.SerialNumber, cb.SerialNumber)
	}
	if got := p.orders(); got != 1 {
		t.Fatalf("%d certificates issued for two nodes on one storage; want 1", got)
	}
	if !solved(logsB, "tls-alpn-01") || solved(logsA, "tls-alpn-01") {
		t.Fatalf("solved by B: %v, by A: %v; want B to have ordered (A answering from storage)", solved(logsB, "tls-alpn-01"), solved(logsA, "tls-alpn-01"))
	}
}

// ocspResponder answers OCSP requests "good" for any serial, signed by
// Pebble's intermediate (the issuer), as an OCSP responder run by the CA
// would (RFC 6960; the request and response are built and parsed with
// golang.org/x/crypto/ocsp, the package certmagic fetches staples with).
type ocspResponder struct {
	mu      sync.Mutex
	issuer  *x509.Certificate
	key     crypto.Signer
	answers int
}

func (o *ocspResponder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	req, err := ocsp.ParseRequest(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	issuer, key := o.issuer, o.key
	o.answers++
	o.mu.Unlock()
	if issuer == nil {
		http.Error(w, "issuer not known yet", http.StatusServiceUnavailable)
		return
	}
	now := time.Now().Truncate(time.Second)
	resp, err := ocsp.CreateResponse(issuer, issuer, ocsp.Response{
		Status: ocsp.Good, SerialNumber: req.SerialNumber,
		ThisUpdate: now.Add(-time.Minute), NextUpdate: now.Add(time.Hour),
	}, key)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/ocsp-response")
	w.Write(resp)
}

// pemGet fetches one PEM block from Pebble's management interface.
func (p *pebble) pemGet(t *testing.T, path string) *pem.Block {
	t.Helper()
	resp, err := p.client(t).Get(p.mgmt + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("pebble's %s: no PEM block (status %d): %q", path, resp.StatusCode, b)
	}
	return blk
}

// The certificate names an OCSP responder: the node fetches a response and
// staples it to its TLS handshakes, and the staple verifies against the
// issuer as "good" for the served certificate.
func TestACMEOCSPStapled(t *testing.T) {
	resp := &ocspResponder{}
	ocspLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ocspSrv := &http.Server{Handler: resp, ReadHeaderTimeout: 5 * time.Second}
	go ocspSrv.Serve(ocspLn)
	t.Cleanup(func() { ocspSrv.Close() })

	httpsPort := freePort(t)
	p := startPebble(t, freePort(t), httpsPort, "http://"+ocspLn.Addr().String()+"/")
	issuer, err := x509.ParseCertificate(p.pemGet(t, "/intermediates/0").Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.ParsePKCS1PrivateKey(p.pemGet(t, "/intermediate-keys/0").Bytes)
	if err != nil {
		t.Fatal(err)
	}
	resp.mu.Lock()
	resp.issuer, resp.key = issuer, key
	resp.mu.Unlock()

	roots := p.root(t)
	cfg := acmeNodeConfig(t, p, "ocsp.sluice.test", 0, httpsPort, t.TempDir(), "      challenges: [tls-alpn-01]\n      profile: default\n")
	n, _, _ := startACMENode(t, cfg)
	addr := n.Server().Addr(listen.ListenerHTTPS)
	leaf := servedCert(t, addr, "ocsp.sluice.test", roots, 30*time.Second)
	if len(leaf.OCSPServer) != 1 {
		t.Fatalf("the certificate names OCSP responders %q; want the test's", leaf.OCSPServer)
	}
	var staple []byte
	waitUntil(t, 15*time.Second, "an OCSP staple in the handshake", func() bool {
		c, err := tls.Dial("tcp", addr, &tls.Config{ServerName: "ocsp.sluice.test", RootCAs: roots})
		if err != nil {
			return false
		}
		defer c.Close()
		staple = c.ConnectionState().OCSPResponse
		return len(staple) > 0
	})
	r, err := ocsp.ParseResponseForCert(staple, leaf, issuer)
	if err != nil {
		t.Fatalf("the staple does not verify against the issuer: %v", err)
	}
	if r.Status != ocsp.Good || r.SerialNumber.Cmp(leaf.SerialNumber) != 0 {
		t.Fatalf("staple status %d for serial %v; want good (%d) for %v", r.Status, r.SerialNumber, ocsp.Good, leaf.SerialNumber)
	}
}
