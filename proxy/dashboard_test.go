package proxy_test

import (
	"encoding/json"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-proxy/sluice/internal/redistest"
	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/proxy/observe"
)

// dashboardPath is the Grafana dashboard shipped in the repository.
const dashboardPath = "../docs/grafana/sluice.json"

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdent    = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	// promWords are PromQL's keywords and the names its functions and
	// aggregations take (a function is also told apart by its "(").
	promWords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true,
		"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true}
)

// promMetricNames returns the metric names a PromQL expression (or a
// Grafana label_values query) reads: every identifier outside strings,
// label matchers, ranges and groupings that is not a keyword or a call.
// Grafana variables ($route, $__rate_interval) are dropped first.
func promMetricNames(expr string) []string {
	expr = regexp.MustCompile(`\$\{?\w+\}?`).ReplaceAllString(expr, "")
	expr = promString.ReplaceAllString(expr, `""`)
	expr = promMatchers.ReplaceAllString(expr, " ")
	expr = promRange.ReplaceAllString(expr, " ")
	expr = promGrouping.ReplaceAllString(expr, " ")
	if strings.HasPrefix(strings.TrimSpace(expr), "label_values(") { // label_values(metric, label)
		expr = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(expr), "label_values("), ")")
		expr, _, _ = strings.Cut(expr, ",")
	}
	var names []string
	for _, loc := range promIdent.FindAllStringIndex(expr, -1) {
		name, rest := expr[loc[0]:loc[1]], strings.TrimLeft(expr[loc[1]:], " ")
		if promWords[strings.ToLower(name)] || strings.HasPrefix(rest, "(") {
			continue
		}
		if loc[0] > 0 && (expr[loc[0]-1] >= '0' && expr[loc[0]-1] <= '9' || expr[loc[0]-1] == '.') {
			continue // the exponent or tail of a number (1e3)
		}
		names = append(names, name)
	}
	return names
}

func TestPromMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`histogram_quantile(0.99, sum by (le, route) (rate(sluice_ttft_seconds_bucket{route=~"$route"}[$__rate_interval])))`,
			[]string{"sluice_ttft_seconds_bucket"}},
		{`sum by (code) (rate(sluice_requests_total{code!~"2.."}[5m])) / ignoring(code) group_left sum(rate(x_total[1m]))`,
			[]string{"sluice_requests_total", "x_total"}},
		{`max(sluice_limiter_breaker_open) or vector(0)`, []string{"sluice_limiter_breaker_open"}},
		{`label_values(sluice_requests_total, route)`, []string{"sluice_requests_total"}},
		{`rate(a{le="1e3", b="sum(c)"}[1m]) * 1e3 > bool 0.5`, []string{"a"}},
	} {
		if got := promMetricNames(tc.expr); !slices.Equal(got, tc.want) {
			t.Errorf("promMetricNames(%q) = %q; want %q", tc.expr, got, tc.want)
		}
	}
}

// dashboardQueries returns every query of the dashboard: each panel's
// targets (rows' nested panels too) and each query variable.
func dashboardQueries(t *testing.T, raw []byte) []string {
	t.Helper()
	type panel struct {
		Title   string  `json:"title"`
		Type    string  `json:"type"`
		Panels  []panel `json:"panels"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	}
	var d struct {
		SchemaVersion int     `json:"schemaVersion"`
		Panels        []panel `json:"panels"`
		Templating    struct {
			List []struct {
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	if d.SchemaVersion < 39 {
		t.Errorf("schemaVersion %d; want Grafana 11's (39 or later)", d.SchemaVersion)
	}
	var out []string
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				if tg.Expr == "" {
					t.Errorf("panel %q has an empty query", p.Title)
				}
				out = append(out, tg.Expr)
			}
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("variable query %s: %v", v.Query, err)
		}
		out = append(out, q.Query)
	}
	return out
}

// TestDashboardQueriesNameExportedMetrics checks docs/grafana/sluice.json
// against what a running Sluice exports: an edge with the proxy's and the
// pools' metrics, the shared limiter's on a real redis-server, a real
// simulator scraped for its engine gauges, and traffic that touches the
// series (a stream, then refusals; a retry, a hedge and a WebSocket count
// touched directly). Every metric a query reads, less a
// histogram's _bucket, _sum or _count suffix, must be among the gathered
// families.
func TestDashboardQueriesNameExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	queries := dashboardQueries(t, raw)

	rds := redistest.Start(t)
	limReg := prometheus.NewRegistry()
	shared, err := limiter.NewFromConfig(limiter.RedisConfig{Addrs: []string{rds.Addr()}}, limReg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shared.Close() })
	_, simURL := startSim(t, fastSim())
	pc := poolOf(simURL)
	pc.ScrapeInterval = 50 * time.Millisecond
	obsReg := prometheus.NewRegistry()
	metrics := observe.NewMetrics(obsReg, 0)
	e := startEdge(t, edgeOpts{pool: pc, start: true, metrics: metrics, limiter: shared,
		limits: limiter.Limits{RequestsPerMinute: 2}})
	// The series no plain stream touches: a retry, a hedge, a WebSocket.
	metrics.Retry("-")
	metrics.Hedge("-", "fired")
	metrics.WSOpen(observe.WSModeBridge, 0)
	for i := 0; i < 3; i++ { // the third is refused
		resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	gatherers := prometheus.Gatherers{e.reg, limReg, obsReg}
	families := map[string]*dto.MetricFamily{}
	waitFor(t, 5*time.Second, "the engine gauges of a scrape", func() bool {
		mfs, err := gatherers.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			families[mf.GetName()] = mf
		}
		return families["sluice_backend_engine_waiting"] != nil && families["sluice_refusals_total"] != nil
	})

	checked := 0
	for _, q := range queries {
		names := promMetricNames(q)
		if len(names) == 0 {
			t.Errorf("query %q reads no metric", q)
		}
		for _, n := range names {
			checked++
			if families[n] != nil {
				continue
			}
			base := n
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				base = strings.TrimSuffix(base, suffix)
			}
			if mf := families[base]; mf != nil && mf.GetType() == dto.MetricType_HISTOGRAM {
				continue
			}
			t.Errorf("query %q reads %s, which Sluice does not export", q, n)
		}
	}
	if checked < 30 {
		t.Fatalf("%d metric references checked; the dashboard has more", checked)
	}
}
