package configs

import (
	"strings"
	"testing"
	"time"

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
