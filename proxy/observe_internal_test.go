package proxy

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/proxy/listen"
	"github.com/sluice-proxy/sluice/proxy/observe"
	"github.com/sluice-proxy/sluice/routing"
)

// BenchmarkObserve measures the per-request bookkeeping of a finished
// non-streamed request: the Server-Timing header, metrics, /debug/stats
// and a JSON access log line (to io.Discard). An op is one request.
//
//	go test -run '^$' -bench BenchmarkObserve -benchmem ./proxy/
func BenchmarkObserve(b *testing.B) {
	p, err := routing.NewPool(routing.PoolConfig{Name: "p", Backends: []routing.BackendConfig{{URL: "http://127.0.0.1:9"}}})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	route := &routing.Route{RouteConfig: routing.RouteConfig{Name: "r", Pool: "p"}.WithDefaults(), Pool: p}
	h := &Handler{log: slog.Default(), access: observe.NewAccessLog(io.Discard, "json"),
		metrics: observe.NewMetrics(prometheus.NewRegistry(), 0), stats: observe.NewStats()}
	r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	tenant := &Tenant{ID: "t1"}
	// A real loopback TCP connection, so that reading the RTT is the
	// TCP_INFO system call it is in production.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	info, _ := listen.ConnInfoFrom(listen.ConnContext(context.Background(), c))
	rtt := info.RTT
	b.ReportAllocs()
	for b.Loop() {
		t0 := time.Now()
		x := &exchange{h: h, r: r, id: "req-1", tenant: tenant, route: route, backend: p.Backends()[0],
			conn: listen.ConnInfo{Proto: listen.ProtoH1, RTT: rtt}, status: 200,
			decision: limiter.Decision{Allowed: true, Ticket: &limiter.Ticket{}},
			usage:    &limiter.Usage{InputTokens: 3, OutputTokens: 1}}
		x.start, x.authDone, x.bodyRead, x.routed = t0, t0.Add(time.Microsecond), t0.Add(2*time.Microsecond), t0.Add(3*time.Microsecond)
		x.limited, x.admitted, x.picked = t0.Add(4*time.Microsecond), t0.Add(4*time.Microsecond), t0.Add(5*time.Microsecond)
		x.upstreamHeaders, x.firstToken = t0.Add(50*time.Microsecond), t0.Add(60*time.Microsecond)
		_ = x.serverTiming()
		h.observe(x)
	}
}
