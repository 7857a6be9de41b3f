package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"

	"github.com/sluice-proxy/sluice/configs"
	"github.com/sluice-proxy/sluice/internal/gpusim"
	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/proxy/bridge"
	"github.com/sluice-proxy/sluice/proxy/listen"
	"github.com/sluice-proxy/sluice/proxy/observe"
	"github.com/sluice-proxy/sluice/proxy/tracing"
	"github.com/sluice-proxy/sluice/routing"
	"github.com/sluice-proxy/sluice/tls/certs"
)

// Node is one running Sluice: its simulators, handler and listeners. Its
// config can be replaced while it runs (see Reload). Make one with Start;
// the zero value is not usable. Its methods are safe for simultaneous use
// by multiple goroutines.
type Node struct {
	// affinityRedis: see poolSet; closed by Close.
	affinityRedis redis.UniversalClient

	log      *slog.Logger
	reg      *prometheus.Registry
	handler  *proxy.Handler
	server   *listen.Server
	admin    *http.ServeMux // the admin listener's routes
	certs    *certs.Store
	limiter  limiter.Service
	serveErr chan error
	bgCtx    context.Context    // background work: limiter, file watcher, pools
	stopBg   context.CancelFunc // ends background work
	bgDone   chan struct{}      // closed when the limiter's Run returns
	workers  sync.WaitGroup     // the file watcher and retirements
	watch    *fileWatcher       // config, tenants and certificate files
	tracer   *tracing.Tracer    // nil: tracing off; flushed and stopped by Close

	cfg    atomic.Pointer[configs.Config] // the active config
	status reloadStatus

	mu       sync.Mutex // serialises reloads; guards the fields below
	sims     map[string]*simServer
	pools    poolSet
	draining []<-chan struct{} // replaced states some requests still use
	closing  bool
}

// simServer is an in-process simulated backend on a loopback port.
type simServer struct {
	cfg gpusim.Config
	sim *gpusim.Sim
	srv *http.Server
	url string
}

// Options are a node's settings that do not come from its config.
type Options struct {
	// Log receives the node's log. Nil means slog.Default().
	Log *slog.Logger
	// AccessLog receives one line per request. Nil means none.
	AccessLog *observe.AccessLog
	// Version is the service.version of the node's traces.
	Version string
}

// Start wires a config into a running node: simulators, pools, limiter,
// certificates, listeners, and the file watcher that reloads certificates
// when their files change (see WatchConfig for the config's files).
// Background work (limiter heartbeat, certificate reloads, pools'
// scrapers) runs until Close, or until parent is done. Stop the node with
// Shutdown, then Close.
func Start(parent context.Context, cfg *configs.Config, opts Options) (*Node, error) {
	log, access := opts.Log, opts.AccessLog
	if log == nil {
		log = slog.Default()
	}
	n := &Node{log: log, reg: prometheus.NewRegistry(), sims: map[string]*simServer{}, serveErr: make(chan error, 1)}
	n.cfg.Store(cfg)
	n.bgCtx, n.stopBg = context.WithCancel(parent)
	started := false
	defer func() {
		if !started {
			n.stopBg()
			n.stopSimulators()
			if n.certs != nil {
				n.certs.Close()
			}
			n.pools.close(poolSet{})
			if n.affinityRedis != nil {
				n.affinityRedis.Close()
			}
			if n.bgDone != nil {
				<-n.bgDone
				n.limiter.Close()
			}
			n.stopTracer()
		}
	}()
	n.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	n.status.register(n.reg)
	sims, err := n.simulatorsFor(cfg)
	n.sims = sims
	if err != nil {
		return nil, err
	}
	if cfg.Redis.Enabled() {
		c, err := limiter.NewClient(cfg.Redis) // pools with affinity.share
		if err != nil {
			return nil, err
		}
		n.affinityRedis = c
	}
	st, pools, err := buildState(cfg, simURLs(sims), poolSet{affinityRedis: n.affinityRedis})
	if err != nil {
		return nil, err
	}
	n.pools = pools
	n.limiter = limiter.NewLocal(1)
	if cfg.Redis.Enabled() {
		shared, err := limiter.NewFromConfig(cfg.Redis, n.reg, log)
		if err != nil {
			return nil, fmt.Errorf("redis limiter: %w", err)
		}
		n.limiter = shared
		if cfg.Region.Enabled() { // several regions share the global limits
			region, err := limiter.NewRegionFromConfig(shared, cfg.Node.Region, cfg.Region, log)
			if err != nil {
				shared.Close()
				return nil, fmt.Errorf("region limiter: %w", err)
			}
			n.limiter = region
		}
	}
	st.Limiter = n.limiter
	n.bgDone = make(chan struct{})
	go func() {
		defer close(n.bgDone)
		n.limiter.Run(n.bgCtx)
	}()
	metrics := observe.NewMetrics(n.reg, cfg.Proxy.TenantMetricLabels)
	if n.tracer, err = startTracer(n.bgCtx, cfg.Tracing, opts.Version, log); err != nil {
		return nil, err
	}
	n.handler = proxy.NewHandler(st, proxy.Options{
		Node: cfg.Node.Name, Region: cfg.Node.Region, Log: log, AccessLog: access,
		Metrics: metrics, Stats: observe.NewStats(), Tracer: n.tracer,
	})
	n.reg.MustRegister(routing.Collector(func() []*routing.Pool { return n.handler.State().Routes.Pools() }))
	n.server = &listen.Server{
		Handler: bridge.New(n.handler, bridge.Options{Log: log, Metrics: metrics}), HTTPAddr: cfg.Listeners.HTTP, AdminAddr: cfg.Listeners.Admin, Log: log,
		MaxConnsPerAddr: cfg.Listeners.MaxConnsPerAddr, FirstRequestTimeout: cfg.Listeners.FirstRequestTimeout, IdleTimeout: cfg.Listeners.IdleTimeout,
		HTTPProxyProtocol: cfg.Listeners.HTTPProxyProtocol, ClientHeader: cfg.Listeners.ClientAddressHeader,
		H2Server:   cfg.Listeners.H2Server,
		HTTPServer: cfg.Listeners.HTTPServer,
	}
	if n.server.TrustedProxies, err = listen.ParsePrefixes(cfg.Listeners.TrustedProxies); err != nil {
		return nil, fmt.Errorf("listeners.trusted_proxies: %w", err)
	}
	if h := cfg.Listeners.HTTPS; h != nil {
		n.certs, err = certs.New(h.Config, log, n.reg)
		if err != nil {
			return nil, fmt.Errorf("loading certificates: %w", err)
		}
		n.server.HTTPSAddr, n.server.TLSConfig = h.Addr, n.certs.TLSConfig()
		n.server.HTTP3, n.server.QUICTLSConfig = h.HTTP3, n.certs.QUICConfig()
		n.server.HTTPSProxyProtocol = h.ProxyProtocol
		n.server.Handler = n.certs.ACMEHTTPHandler(n.server.Handler) // HTTP-01 before routing and auth
	}
	admin := observe.NewAdmin(n.reg, n.server.Draining, n.handler.Snapshot)
	n.adminRoutes(admin)
	n.admin = admin
	if n.server.Admin, err = n.guardAdmin(admin, cfg); err != nil {
		return nil, err
	}
	if err := n.server.Listen(); err != nil {
		return nil, err
	}
	if n.certs != nil {
		n.certs.StartACME(n.server.Addr(listen.ListenerHTTP), n.server.Addr(listen.ListenerHTTPS))
	}
	pools.start(n.bgCtx, poolSet{})
	n.status.loaded(cfg, time.Now())
	n.startWatcher()
	go func() { n.serveErr <- n.server.Serve() }()
	started = true
	return n, nil
}

// Config returns the active config.
func (n *Node) Config() *configs.Config { return n.cfg.Load() }

// Server returns the node's listeners (addresses, drain state).
func (n *Node) Server() *listen.Server { return n.server }

// Handler returns the node's proxy handler (its state, its statistics).
func (n *Node) Handler() *proxy.Handler { return n.handler }

// Certs returns the certificates of the HTTPS listener; nil without one.
func (n *Node) Certs() *certs.Store { return n.certs }

// Err receives the error of a listener that failed while serving.
func (n *Node) Err() <-chan error { return n.serveErr }

// simulatorsFor returns the simulators cfg names: running ones whose
// config is unchanged, and new ones started for the rest. On error the
// new ones are included, for the caller to stop.
func (n *Node) simulatorsFor(cfg *configs.Config) (map[string]*simServer, error) {
	out := make(map[string]*simServer, len(cfg.Simulators))
	for _, s := range cfg.Simulators {
		if cur, ok := n.sims[s.Name]; ok && reflect.DeepEqual(cur.cfg, s.Config) {
			out[s.Name] = cur
			continue
		}
		ss, err := startSimulator(s)
		if err != nil {
			return out, err
		}
		out[s.Name] = ss
	}
	return out, nil
}

func startSimulator(s configs.Simulator) (*simServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("starting simulator %q: %w", s.Name, err)
	}
	sim := gpusim.New(s.Config)
	srv := &http.Server{Handler: sim, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	return &simServer{cfg: s.Config, sim: sim, srv: srv, url: "http://" + ln.Addr().String()}, nil
}

func (s *simServer) stop() {
	s.srv.Close()
	s.sim.Close()
}

func simURLs(sims map[string]*simServer) map[string]string {
	m := make(map[string]string, len(sims))
	for name, s := range sims {
		m[name] = s.url
	}
	return m
}

// SimURL is the address of a running simulator, or "".
func (n *Node) SimURL(name string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if s, ok := n.sims[name]; ok {
		return s.url
	}
	return ""
}

func (n *Node) stopSimulators() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, s := range n.sims {
		s.stop()
	}
}

// Shutdown drains the node: reloads stop, /readyz fails, after
// node.drain_delay the listeners stop accepting, live streams get up to
// node.drain_timeout, then are cancelled with an error event.
func (n *Node) Shutdown() error {
	n.mu.Lock()
	n.closing = true
	n.mu.Unlock()
	cfg := n.Config()
	n.server.StartDrain()
	if d := cfg.Node.DrainDelay; d > 0 {
		n.log.Info("draining: /readyz fails; listeners close after the drain delay", "drain_delay", d)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-n.bgCtx.Done():
		}
		t.Stop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Node.DrainTimeout)
	defer cancel()
	err := n.server.Shutdown(ctx)
	n.stopSimulators()
	return err
}

// Close stops background work (file watcher, pools, limiter) and releases
// what outlives the listeners: in-flight settles during the drain still had
// the limiter. Call it after Shutdown.
func (n *Node) Close() {
	n.handler.Close()       // the event loops: their streams ended in Shutdown (listen.Hold)
	n.handler.WaitSettles() // settles outliving their responses need the limiter
	n.stopBg()
	<-n.bgDone
	n.workers.Wait()
	n.mu.Lock()
	n.pools.close(poolSet{})
	n.mu.Unlock()
	if n.affinityRedis != nil {
		n.affinityRedis.Close()
	}
	n.limiter.Close()
	if n.certs != nil {
		n.certs.Close() // ACME renewals
	}
	n.stopTracer()
}

// startTracer starts the OTLP exporter when cfg enables tracing (nil
// otherwise); export errors go to log at warn.
func startTracer(ctx context.Context, cfg tracing.Config, version string, log *slog.Logger) (*tracing.Tracer, error) {
	tr, err := tracing.New(ctx, cfg, version)
	if err != nil || tr == nil {
		return nil, err
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("tracing", "err", err) }))
	log.Info("tracing on", "endpoint", cfg.Endpoint, "protocol", cfg.Protocol)
	return tr, nil
}

// stopTracer flushes the spans still queued (within 5 s) and stops the
// exporter's goroutines.
func (n *Node) stopTracer() {
	if n.tracer == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.tracer.Shutdown(ctx); err != nil {
		n.log.Warn("tracing: flushing spans at shutdown", "err", err)
	}
	n.tracer = nil
}

// poolSet is a state's pools and their transports, by pool name.
type poolSet struct {
	pools      map[string]*routing.Pool
	transports map[string]http.RoundTripper
	// affinityRedis is the node's Redis client for pools sharing their
	// prefix table (affinity.share); nil without a redis section.
	affinityRedis redis.UniversalClient
}

// start starts the scrapers and probes of the pools that are not in old.
func (s poolSet) start(ctx context.Context, old poolSet) {
	for name, p := range s.pools {
		if old.pools[name] != p {
			p.Start(ctx)
		}
	}
}

// close stops the pools that are not in keep (scrapers, probes) and
// closes their transports' idle connections.
func (s poolSet) close(keep poolSet) {
	for name, p := range s.pools {
		if keep.pools[name] == p {
			continue
		}
		p.Close()
		if t, ok := s.transports[name].(interface{ CloseIdleConnections() }); ok {
			t.CloseIdleConnections()
		}
	}
}

// buildState turns a validated config into the handler's state; simURLs
// resolves "sim://NAME" backends. A pool whose resolved config equals one
// in reuse is reused with its transport (keeping its health, load and
// background work), unless it reads upstream TLS files, which a reload
// re-reads; the other pools are new, not yet started.
func buildState(cfg *configs.Config, simURLs map[string]string, reuse poolSet) (*proxy.State, poolSet, error) {
	set := poolSet{pools: map[string]*routing.Pool{}, transports: map[string]http.RoundTripper{}, affinityRedis: reuse.affinityRedis}
	for _, pc := range cfg.Pools {
		pc.Backends = append([]routing.BackendConfig(nil), pc.Backends...)
		for i, b := range pc.Backends {
			u, err := url.Parse(b.URL)
			if err == nil && u.Scheme == "sim" {
				base, ok := simURLs[u.Host]
				if !ok {
					return nil, poolSet{}, fmt.Errorf("pool %q: simulator %q is not running", pc.Name, u.Host)
				}
				pc.Backends[i].URL = base
			}
		}
		if old, ok := reuse.pools[pc.Name]; ok && pc.TLS == nil && reflect.DeepEqual(old.Config(), pc.WithDefaults()) {
			set.pools[pc.Name], set.transports[pc.Name] = old, reuse.transports[pc.Name]
			continue
		}
		p, err := routing.NewPool(pc)
		if err != nil {
			return nil, poolSet{}, fmt.Errorf("pool %q: %w", pc.Name, err)
		}
		p.InheritAffinity(reuse.pools[pc.Name]) // prefix affinity survives the rebuild
		if p.Config().Affinity.Share && reuse.affinityRedis == nil {
			return nil, poolSet{}, fmt.Errorf("pool %q: affinity.share needs the redis section", pc.Name)
		}
		tr, err := proxy.NewPoolTransport(cfg.Proxy, p.Config())
		if err != nil {
			return nil, poolSet{}, err
		}
		p.UseTransport(tr) // scrapes and probes with the pool's TLS settings
		set.pools[pc.Name], set.transports[pc.Name] = p, tr
	}
	var routes []*routing.Route
	policies := map[*routing.Route]*proxy.RoutePolicy{}
	for _, rc := range cfg.Routes {
		p, ok := set.pools[rc.Pool]
		if !ok {
			return nil, poolSet{}, errors.New("route " + rc.Name + ": unknown pool " + rc.Pool)
		}
		rt := &routing.Route{RouteConfig: rc.RouteConfig, Pool: p}
		routes, policies[rt] = append(routes, rt), &rc.RoutePolicy
	}
	for name, p := range set.pools { // last: nothing fails after, so no writer is left running
		if a := p.Config().Affinity; a.Share && reuse.pools[name] != p {
			p.ShareAffinity(routing.SharedAffinity{Client: set.affinityRedis, TTL: a.ShareTTL, Timeout: a.ShareTimeout})
		}
	}
	return &proxy.State{
		Config:     cfg.Proxy,
		Tenants:    proxy.NewTenants(cfg.AllTenants()),
		Routes:     routing.NewTable(routes),
		Policies:   policies,
		Transports: set.transports,
	}, set, nil
}
