package configs

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/routing"
)

const routingYAML = `listeners:
  http: 127.0.0.1:8080
pools:
  - name: p
    policy: %POLICY%
    dialect: %DIALECT%
    scrape_interval: 100ms
    health:
      path: /ready
      interval: 1s
      timeout: %TIMEOUT%
    queue:
      max_waiting: 2
      target_utilization: %UTIL%
      max_queue_wait: 3s
    backends:
      - url: http://127.0.0.1:8000
        max_batch: 16
      - url: http://127.0.0.1:8001
        max_batch: %BATCH%
        dialect: sglang
routes:
  - pool: p
    hedge_after: %HEDGE%
    first_token_timeout: 2s
`

func routingConfig(repl ...string) string {
	defaults := map[string]string{"%POLICY%": "least_queued", "%DIALECT%": "auto", "%TIMEOUT%": "500ms",
		"%UTIL%": "0.7", "%BATCH%": "32", "%HEDGE%": "300ms"}
	for i := 0; i+1 < len(repl); i += 2 {
		defaults[repl[i]] = repl[i+1]
	}
	y := routingYAML
	for k, v := range defaults {
		y = strings.ReplaceAll(y, k, v)
	}
	return y
}

func TestRoutingKeys(t *testing.T) {
	c, err := Parse("r.yaml", []byte(routingConfig()))
	if err != nil {
		t.Fatal(err)
	}
	p := c.Pools[0]
	if p.Policy != routing.PolicyLeastQueued || p.ScrapeInterval != 100*time.Millisecond || p.StaleAfter != time.Second ||
		p.Health.Path != "/ready" || p.Health.FailAfter != 2 || p.Queue.MaxWaiting != 2 || p.Queue.TargetUtilization != 0.7 ||
		p.Queue.MaxWait != 3*time.Second || p.Queue.MaxLength != 1024 {
		t.Errorf("pool %+v", p)
	}
	if b := p.Backends[1]; b.MaxBatch != 32 || b.Dialect != routing.DialectSGLang || p.Backends[0].Dialect != routing.DialectAuto {
		t.Errorf("backends %+v", p.Backends)
	}
	if c.Routes[0].HedgeAfter != 300*time.Millisecond {
		t.Errorf("route %+v", c.Routes[0])
	}
	// Defaults when nothing is set.
	c, err = Parse("min.yaml", []byte(valid))
	if err != nil {
		t.Fatal(err)
	}
	if p := c.Pools[0]; p.Policy != "least_queued" || p.Dialect != "auto" || p.ScrapeInterval != 250*time.Millisecond ||
		p.Health.Path != "/health" || p.Health.Interval != 2*time.Second || p.Queue.MaxWait != 10*time.Second {
		t.Errorf("pool defaults %+v", p)
	}
}

func TestRoutingKeyErrors(t *testing.T) {
	cases := []struct {
		name string
		repl []string
		want string
	}{
		{"policy", []string{"%POLICY%", "fastest"}, `5:13: pool "p": policy "fastest" must be least_queued`},
		{"dialect", []string{"%DIALECT%", "triton"}, `6:14: pool "p": dialect "triton" must be auto`},
		{"probe timeout", []string{"%TIMEOUT%", "2s"}, `11:16: pool "p": health.timeout 2s must not exceed`},
		{"utilisation", []string{"%UTIL%", "1.5"}, `14:27: pool "p": queue.target_utilization 1.5 must be a fraction`},
		{"batch on some", []string{"%BATCH%", "0"}, `17:7: pool "p": set max_batch on every backend`},
		{"hedge", []string{"%HEDGE%", "2s"}, `24:18: routes[0]: hedge_after 2s must be shorter than the first-token timeout 2s`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("r.yaml", []byte(routingConfig(tc.repl...)))
			if err == nil || !strings.Contains(err.Error(), "r.yaml:"+tc.want) {
				t.Fatalf("got %v; want an error containing %q", err, "r.yaml:"+tc.want)
			}
			if n := len(Errors(err)); n != 1 {
				t.Fatalf("got %d errors; want 1: %v", n, err)
			}
		})
	}
	y := strings.Replace(routingConfig("%UTIL%", "0.5"), "        max_batch: 16\n", "", 1)
	y = strings.Replace(y, "        max_batch: 32\n", "", 1)
	if _, err := Parse("r.yaml", []byte(y)); err == nil || !strings.Contains(err.Error(), "needs the batch slots") {
		t.Fatalf("target_utilization without max_batch: %v", err)
	}
}

// A route's keys land in both halves of Route: routing's and the proxy's.
func TestRouteKeysDecodeIntoBothHalves(t *testing.T) {
	y := valid + `  - name: events
    host: api.example.com
    path: /events/
    models: [m]
    pool: p
    class: batch
    kind: sse
    allow_query_key: true
    first_token_timeout: 5s
    retries: 2
    enforce_limits: false
    allow_enforced_tenants: true
    hedge_after: 1s
    timing_comment: true
`
	c, err := Parse("r.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	r := c.Routes[1]
	want := routing.RouteConfig{Name: "events", Host: "api.example.com", Path: "/events/", Models: []string{"m"}, Pool: "p", Class: "batch"}
	if !reflect.DeepEqual(r.RouteConfig, want) {
		t.Errorf("routing half %+v; want %+v", r.RouteConfig, want)
	}
	p := r.RoutePolicy
	if p.Kind != proxy.KindSSE || !p.AllowQueryKey || p.FirstTokenTimeout != 5*time.Second || p.Retries == nil || *p.Retries != 2 ||
		p.LimitsEnforced() || !p.AllowEnforcedTenants || p.HedgeAfter != time.Second || !p.TimingComment {
		t.Errorf("proxy half %+v", p)
	}
	if d := c.Routes[0]; d.Kind != proxy.KindOpenAI || d.Path != "/v1/" || d.Class != routing.ClassInteractive || !d.LimitsEnforced() {
		t.Errorf("defaults %+v", d)
	}
}

// The proxy's route keys are reported at their own positions, in the
// order they always were (kind before the bridge's path, then the rest).
func TestRoutePolicyKeyErrors(t *testing.T) {
	y := valid + `  - path: /v1/ws
    kind: grpc
    retries: -1
    pool: p
`
	_, err := Parse("r.yaml", []byte(y))
	if err == nil {
		t.Fatal("no error")
	}
	lines := strings.Split(err.Error(), "\n") // as joined, not sorted by position
	want := []string{
		`r.yaml:10:11: routes[1]: kind "grpc" must be openai, sse or websocket`,
		`r.yaml:9:11: routes[1]: path "/v1/ws" is the WebSocket bridge endpoint (proxy.websocket.path); choose another`,
		`r.yaml:11:14: routes[1]: retries must not be negative`,
	}
	if !reflect.DeepEqual(lines, want) {
		t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}

// allow_enforced_tenants on an enforcing route is a mistake (it would do
// nothing): reported at its position.
func TestAllowEnforcedTenantsNeedsShadowRoute(t *testing.T) {
	y := valid + `  - path: /beta/
    pool: p
    allow_enforced_tenants: true
`
	_, err := Parse("r.yaml", []byte(y))
	if err == nil || !strings.Contains(err.Error(), ":11:29: routes[1]: allow_enforced_tenants applies only to a shadow route") {
		t.Fatalf("error: %v", err)
	}
}
