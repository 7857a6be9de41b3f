package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluice-proxy/sluice/configs"
	"github.com/sluice-proxy/sluice/internal/gpusim"
	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/routing"
	"github.com/sluice-proxy/sluice/tls/certs"
)

// node is one running Sluice: its simulators, handler and listeners.
type node struct {
	cfg      *configs.Config
	log      *slog.Logger
	reg      *prometheus.Registry
	sims     map[string]*simServer
	handler  *proxy.Handler
	pools    []*routing.Pool // running scrapers and probes
	server   *proxy.Server
	certs    *certs.Store
	limiter  limiter.Service
	serveErr chan error
	stopBg   context.CancelFunc // ends background work (heartbeat, cert reload)
	bgDone   chan struct{}
}

// simServer is an in-process simulated backend on a loopback port.
type simServer struct {
	sim *gpusim.Sim
	srv *http.Server
	url string
}

// startNode wires a config into a running node. Background work (limiter
// heartbeat, certificate reloads) runs until close, or until parent is done.
// Stop the node with shutdown, then close.
func startNode(parent context.Context, cfg *configs.Config, log *slog.Logger) (*node, error) {
	n := &node{cfg: cfg, log: log, reg: prometheus.NewRegistry(), sims: map[string]*simServer{}, serveErr: make(chan error, 1)}
	ctx, stopBg := context.WithCancel(parent)
	n.stopBg = stopBg
	started := false
	defer func() {
		if !started {
			stopBg()
			if n.bgDone != nil {
				<-n.bgDone
				n.limiter.Close()
			}
		}
	}()
	n.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := n.startSimulators(); err != nil {
		n.stopSimulators()
		return nil, err
	}
	st, err := buildState(cfg, n.simURLs())
	if err != nil {
		n.stopSimulators()
		return nil, err
	}
	n.limiter = limiter.NewLocal(1)
	if cfg.Redis.Enabled() {
		shared, err := limiter.NewFromConfig(cfg.Redis, n.reg, log)
		if err != nil {
			n.stopSimulators()
			return nil, fmt.Errorf("redis limiter: %w", err)
		}
		n.limiter = shared
	}
	st.Limiter = n.limiter
	n.bgDone = make(chan struct{})
	go func() {
		defer close(n.bgDone)
		n.limiter.Run(ctx)
	}()
	n.handler = proxy.NewHandler(st, proxy.Options{
		Node: cfg.Node.Name, Region: cfg.Node.Region, Log: log, AccessLog: log,
		Metrics: proxy.NewMetrics(n.reg, cfg.Proxy.TenantMetricLabels), Stats: proxy.NewStats(),
	})
	n.reg.MustRegister(routing.Collector(func() []*routing.Pool { return n.handler.State().Routes.Pools() }))
	n.pools = st.Routes.Pools()
	for _, p := range n.pools {
		p.Start(context.Background()) // stopped by closePools
	}
	n.server = &proxy.Server{
		Handler: n.handler, HTTPAddr: cfg.Listeners.HTTP, AdminAddr: cfg.Listeners.Admin, Log: log,
	}
	if h := cfg.Listeners.HTTPS; h != nil {
		n.certs, err = certs.New(h.Config, log, n.reg)
		if err != nil {
			n.closePools()
			n.stopSimulators()
			return nil, fmt.Errorf("loading certificates: %w", err)
		}
		go n.certs.Run(ctx)
		n.server.HTTPSAddr, n.server.TLSConfig = h.Addr, n.certs.TLSConfig()
		n.server.HTTP3, n.server.QUICTLSConfig = h.HTTP3, n.certs.QUICConfig()
	}
	n.server.Admin = proxy.NewAdmin(n.reg, n.server.Draining, n.handler)
	if err := n.server.Listen(); err != nil {
		n.closePools()
		n.stopSimulators()
		return nil, err
	}
	go func() { n.serveErr <- n.server.Serve() }()
	started = true
	return n, nil
}

func (n *node) startSimulators() error {
	for _, s := range n.cfg.Simulators {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("starting simulator %q: %w", s.Name, err)
		}
		sim := gpusim.New(s.Config)
		srv := &http.Server{Handler: sim, ReadHeaderTimeout: 10 * time.Second}
		go srv.Serve(ln)
		n.sims[s.Name] = &simServer{sim: sim, srv: srv, url: "http://" + ln.Addr().String()}
	}
	return nil
}

func (n *node) simURLs() map[string]string {
	m := make(map[string]string, len(n.sims))
	for name, s := range n.sims {
		m[name] = s.url
	}
	return m
}

func (n *node) stopSimulators() {
	for _, s := range n.sims {
		s.srv.Close()
		s.sim.Close()
	}
}

// shutdown drains the node: /readyz fails, listeners stop accepting, live
// streams get up to the drain timeout, then are cancelled.
func (n *node) shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.Node.DrainTimeout)
	defer cancel()
	err := n.server.Shutdown(ctx)
	n.closePools()
	n.stopSimulators()
	return err
}

// closePools stops the pools' scrapers and health probes.
func (n *node) closePools() {
	for _, p := range n.pools {
		p.Close()
	}
}

// close stops background work and releases what outlives the listeners:
// in-flight settles during the drain still had the limiter.
func (n *node) close() {
	n.stopBg()
	<-n.bgDone
	n.limiter.Close()
}

// buildState turns a validated config into the handler's state; simURLs
// resolves "sim://NAME" backends.
func buildState(cfg *configs.Config, simURLs map[string]string) (*proxy.State, error) {
	pools := map[string]*routing.Pool{}
	transports := map[string]http.RoundTripper{}
	for _, pc := range cfg.Pools {
		pc.Backends = append([]routing.BackendConfig(nil), pc.Backends...)
		for i, b := range pc.Backends {
			u, err := url.Parse(b.URL)
			if err == nil && u.Scheme == "sim" {
				base, ok := simURLs[u.Host]
				if !ok {
					return nil, fmt.Errorf("pool %q: simulator %q is not running", pc.Name, u.Host)
				}
				pc.Backends[i].URL = base
			}
		}
		p, err := routing.NewPool(pc)
		if err != nil {
			return nil, fmt.Errorf("pool %q: %w", pc.Name, err)
		}
		pools[pc.Name] = p
		tr, err := proxy.NewPoolTransport(cfg.Proxy, p.Config())
		if err != nil {
			return nil, err
		}
		transports[pc.Name] = tr
		p.UseTransport(tr) // scrapes and probes with the pool's TLS settings
	}
	var routes []*routing.Route
	for _, rc := range cfg.Routes {
		p, ok := pools[rc.Pool]
		if !ok {
			return nil, errors.New("route " + rc.Name + ": unknown pool " + rc.Pool)
		}
		routes = append(routes, &routing.Route{RouteConfig: rc, Pool: p})
	}
	return &proxy.State{
		Config:     cfg.Proxy,
		Tenants:    proxy.NewTenants(cfg.Tenants),
		Routes:     routing.NewTable(routes),
		Transports: transports,
	}, nil
}
