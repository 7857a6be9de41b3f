package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go/http3"

	"github.com/sluice-proxy/sluice/internal/gpusim"
	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/proxy/bridge"
	"github.com/sluice-proxy/sluice/proxy/h1up"
	"github.com/sluice-proxy/sluice/proxy/listen"
	"github.com/sluice-proxy/sluice/proxy/observe"
	"github.com/sluice-proxy/sluice/proxy/tracing"
	"github.com/sluice-proxy/sluice/routing"
)

const testKey = "sk-test-key"

// fastSim is a simulator configuration quick enough for unit tests.
func fastSim() gpusim.Config {
	return gpusim.Config{
		Model: "sim-small", MaxBatch: 8, StepBase: 10 * time.Millisecond, StepPerSeq: time.Millisecond,
		PrefillBase: 5 * time.Millisecond, PrefillPerToken: 100 * time.Microsecond, DefaultMaxTokens: 16, Seed: 1,
	}
}

// startSim runs a real simulator on a loopback listener.
func startSim(t testing.TB, cfg gpusim.Config) (*gpusim.Sim, string) {
	t.Helper()
	sim := gpusim.New(cfg)
	srv := httptest.NewServer(sim)
	t.Cleanup(func() { srv.Close(); sim.Close() })
	return sim, srv.URL
}

// testEdge is a Sluice handler on real listeners in front of real backends.
type testEdge struct {
	handler *proxy.Handler
	bridge  *bridge.Bridge // the served handler: the bridge in front of handler
	server  *listen.Server
	http    string // http://host:port (HTTP/1.1 and h2c)
	https   string // https://host:port (HTTP/1.1 and h2)
	h3      string // https://host:port of the UDP listener (HTTP/3)
	log     *logBuffer
	pools   map[string]*routing.Pool
	reg     *prometheus.Registry // the pools' metrics, and the proxy's with promMetrics
}

// testRoute is one route of a test edge: what routing matches on and the
// proxy's policy for it, paired as configs.Route pairs them.
type testRoute struct {
	routing.RouteConfig
	proxy.RoutePolicy
}

type edgeOpts struct {
	pool    routing.PoolConfig
	routes  []testRoute
	proxy   proxy.Config
	extra   []routing.PoolConfig
	limits  limiter.Limits   // the test tenant's limits
	limiter proxy.Limiter    // nil: none
	log     io.Writer        // access log (JSON lines); nil: into testEdge.log
	metrics *observe.Metrics // nil: none
	http3   listen.HTTP3Config
	tls     *tls.Config // nil: httptest's certificate
	quic    *tls.Config // nil: derived from tls
	// start runs the pools' scrapers and health probes (off by default:
	// some tests' backends record every request they get).
	start bool
	// promMetrics registers the proxy's metrics in testEdge.reg (when
	// metrics is nil).
	promMetrics bool
	// pickers wraps each pool's picker (nil: the pools pick).
	pickers func(*routing.Pool) proxy.Picker
	// errLog receives the handler's own log (text); nil: discarded.
	errLog io.Writer
	// tracer makes the handler's spans (nil: tracing off).
	tracer *tracing.Tracer
	// server adjusts the listeners before they bind (nil: as is).
	server func(*listen.Server)
	// h1up reaches the backends with Sluice's own HTTP/1.1 client, whose
	// streams the event loops relay (else net/http's Transport).
	h1up bool
	// noLoop keeps streams on their goroutines (Options.NoEventLoop).
	noLoop bool
}

// startEdge serves a handler for one pool of backends with the given routes
// (default: one OpenAI route for /v1/).
func startEdge(t testing.TB, o edgeOpts) *testEdge {
	t.Helper()
	if o.pool.Name == "" {
		o.pool.Name = "p"
	}
	pools := map[string]*routing.Pool{}
	transports := map[string]http.RoundTripper{}
	for _, pc := range append([]routing.PoolConfig{o.pool}, o.extra...) {
		p, err := routing.NewPool(pc)
		if err != nil {
			t.Fatal(err)
		}
		pools[pc.Name] = p
		t.Cleanup(func() { p.Close() })
		tr, err := proxy.NewPoolTransport(o.proxy, p.Config())
		if err != nil {
			t.Fatal(err)
		}
		p.UseTransport(tr) // as cmd/sluice does: probes with the pool's settings
		if o.start {
			p.Start(context.Background())
		}
		t.Cleanup(tr.CloseIdleConnections)
		transports[pc.Name] = tr
		if (o.h1up || *allH1up) && plainHTTP1(pc) {
			ht := h1up.New(h1up.Options{})
			t.Cleanup(ht.CloseIdleConnections)
			transports[pc.Name] = ht // committed h1 streams go to the event loops
		}
	}
	if len(o.routes) == 0 {
		o.routes = []testRoute{{RouteConfig: routing.RouteConfig{Pool: o.pool.Name}}}
	}
	var routes []*routing.Route
	policies := map[*routing.Route]*proxy.RoutePolicy{}
	for _, rc := range o.routes {
		rt := &routing.Route{RouteConfig: rc.RouteConfig.WithDefaults(), Pool: pools[rc.Pool]}
		pol := rc.RoutePolicy.WithDefaults()
		routes, policies[rt] = append(routes, rt), &pol
	}
	st := &proxy.State{
		Config: o.proxy,
		Tenants: proxy.NewTenants([]proxy.TenantConfig{
			{ID: "t1", Keys: []string{proxy.HashKey(testKey)}, Limits: o.limits},
		}),
		Routes:     routing.NewTable(routes),
		Policies:   policies,
		Limiter:    o.limiter,
		Transports: transports,
	}
	if o.pickers != nil {
		st.Pickers = map[string]proxy.Picker{}
		for name, p := range pools {
			st.Pickers[name] = o.pickers(p)
		}
	}
	if o.errLog == nil {
		o.errLog = io.Discard
	}
	log := slog.New(slog.NewTextHandler(o.errLog, nil))
	logs := &logBuffer{}
	if o.log == nil {
		o.log = logs
	}
	reg := prometheus.NewRegistry()
	if err := routing.RegisterMetrics(reg, st.Routes.Pools); err != nil {
		t.Fatal(err)
	}
	if o.metrics == nil && o.promMetrics {
		o.metrics = observe.NewMetrics(reg, 0)
	}
	h := proxy.NewHandler(st, proxy.Options{Region: "test-region", Log: log, AccessLog: observe.NewAccessLog(o.log, "json"),
		Metrics: o.metrics, Stats: observe.NewStats(), Tracer: o.tracer, NoEventLoop: o.noLoop || *allNoLoop})
	t.Cleanup(h.Close)
	br := bridge.New(h, bridge.Options{Log: log, Metrics: o.metrics})
	if o.tls == nil {
		o.tls = testTLSConfig(t)
	}
	srv := &listen.Server{
		Handler: br, HTTPAddr: "127.0.0.1:0", HTTPSAddr: "127.0.0.1:0", TLSConfig: o.tls,
		HTTP3: o.http3, QUICTLSConfig: o.quic, Log: log, H2Server: testH2Server,
	}
	if o.server != nil {
		o.server(srv)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	t.Cleanup(func() { srv.Close() })
	return &testEdge{
		handler: h, bridge: br, server: srv, pools: pools, reg: reg,
		http:  "http://" + srv.Addr(listen.ListenerHTTP),
		https: "https://" + srv.Addr(listen.ListenerHTTPS),
		h3:    "https://" + srv.Addr(listen.ListenerHTTP3),
		log:   logs,
	}
}

// logBuffer collects a server's JSON log lines; safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines returns the log lines that contain every one of subs.
func (b *logBuffer) lines(subs ...string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, l := range strings.Split(b.buf.String(), "\n") {
		ok := l != ""
		for _, s := range subs {
			ok = ok && strings.Contains(l, s)
		}
		if ok {
			out = append(out, l)
		}
	}
	return out
}

// testTLSConfig uses httptest's certificate for the TLS listener.
func testTLSConfig(t testing.TB) *tls.Config {
	s := httptest.NewUnstartedServer(nil)
	s.StartTLS()
	cfg := s.TLS.Clone()
	s.Close()
	cfg.NextProtos = []string{"h2", "http/1.1"}
	return cfg
}

func poolOf(urls ...string) routing.PoolConfig {
	pc := routing.PoolConfig{Name: "p"}
	for _, u := range urls {
		pc.Backends = append(pc.Backends, routing.BackendConfig{URL: u})
	}
	return pc
}

// clients for each protocol under test.
func h1Client() *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
}

func h2cClient() *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: &p}}
}

func h2Client() *http.Client {
	var p http.Protocols
	p.SetHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: &p, TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
}

// h3Client speaks HTTP/3 (quic-go's client) and trusts any certificate.
func h3Client(t testing.TB) *http.Client {
	return h3ClientTLS(t, &tls.Config{InsecureSkipVerify: true})
}

func h3ClientTLS(t testing.TB, cfg *tls.Config) *http.Client {
	tr := &http3.Transport{TLSClientConfig: cfg}
	t.Cleanup(func() { tr.Close() })
	return &http.Client{Transport: tr}
}

// chatBody is a streamed chat request with the members extra added; a
// max_tokens in extra replaces the default (a body may not repeat it).
func chatBody(extra string) string {
	b := `{"model":"sim-small","stream":true,"max_tokens":12,"messages":[{"role":"user","content":"hello there"}]`
	if strings.Contains(extra, `"max_tokens"`) {
		b = strings.Replace(b, `"max_tokens":12,`, "", 1)
	}
	if extra != "" {
		b += "," + extra
	}
	return b + "}"
}

func post(t testing.TB, c *http.Client, url, body string, hdr ...string) *http.Response {
	t.Helper()
	return postCtx(t, context.Background(), c, url, body, hdr...)
}

func postCtx(t testing.TB, ctx context.Context, c *http.Client, url, body string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// sseEvent is one event as the client received it.
type sseEvent struct {
	name string
	data string
	at   time.Time
}

// readEvents reads a whole SSE body, stamping each event's arrival.
func readEvents(t testing.TB, body io.Reader) (events []sseEvent, done bool) {
	t.Helper()
	br := bufio.NewReader(body)
	var cur sseEvent
	for {
		line, err := br.ReadString('\n')
		line = strings.TrimRight(line, "\r\n")
		switch {
		case strings.HasPrefix(line, "data:"):
			cur.data = strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " ")
			cur.at = time.Now()
		case strings.HasPrefix(line, "event:"):
			cur.name = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case line == "" && (cur.data != "" || cur.name != ""):
			if cur.data == "[DONE]" {
				done = true
			} else {
				events = append(events, cur)
			}
			cur = sseEvent{}
		}
		if err != nil {
			return events, done
		}
	}
}

// waitFor polls cond until it holds or the deadline passes. It is for
// conditions on real state that no event announces; wait on the event
// where one exists.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !poll(d, cond) {
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
}

// poll checks cond every 5ms until it holds (true) or d has passed
// (false).
func poll(d time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			return cond()
		}
	}
	return true
}

// shutdownWithin runs srv.Shutdown(ctx) and fails the test if it has not
// returned within d; it returns Shutdown's error.
func shutdownWithin(t testing.TB, srv *listen.Server, ctx context.Context, d time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- srv.Shutdown(ctx) }() // exits when Shutdown returns
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("Shutdown still running after %v", d)
		return nil
	}
}

// closedURL is a loopback URL where nothing listens.
func closedURL(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

// metric returns the value of a gauge or counter series of the edge's
// registry whose labels include want, or -1 when absent.
func (e *testEdge) metric(t testing.TB, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if have[k] != v {
					continue series
				}
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

func insecure() *tls.Config { return &tls.Config{InsecureSkipVerify: true} }

// httptestAdmin serves the edge's admin handler on a loopback listener.
func httptestAdmin(t testing.TB, e *testEdge) string {
	t.Helper()
	srv := httptest.NewServer(observe.NewAdmin(prometheus.NewRegistry(), func() bool { return false }, e.handler.Snapshot))
	t.Cleanup(srv.Close)
	return srv.URL
}
