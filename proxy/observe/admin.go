package observe

import (
	"encoding/json"
	"html/template"
	"net/http"
	"sort"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewAdmin returns the admin listener's handler: /healthz (the process is
// up), /readyz (it takes traffic: 503 once draining() is true), /metrics
// from gatherer, /debug/stats (JSON) and / (a status page) from snapshot.
func NewAdmin(gatherer prometheus.Gatherer, draining func() bool, snapshot func() StatsSnapshot) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if draining() {
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /debug/stats", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(snapshot())
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		statusPage.Execute(w, pageData(snapshot()))
	})
	return mux
}

// stageRow is one line of the status page's stage table.
type stageRow struct {
	Stage string
	W1m   Percentiles
	W5m   Percentiles
}

type routeView struct {
	Route    string
	Req1m    int
	Req5m    int
	Stages   []stageRow
	Statuses string
}

type page struct {
	StatsSnapshot
	Views []routeView
}

func pageData(s StatsSnapshot) page {
	p := page{StatsSnapshot: s}
	for _, r := range s.Routes {
		v := routeView{Route: r.Route, Req1m: r.Windows["1m"].Requests, Req5m: r.Windows["5m"].Requests}
		for _, st := range statStages {
			a, b := r.Windows["1m"].Stages[st], r.Windows["5m"].Stages[st]
			if a.N > 0 || b.N > 0 {
				v.Stages = append(v.Stages, stageRow{Stage: st, W1m: a, W5m: b})
			}
		}
		codes := make([]string, 0, len(r.Status))
		for c := range r.Status {
			codes = append(codes, c)
		}
		sort.Strings(codes)
		for i, c := range codes {
			if i > 0 {
				v.Statuses += ", "
			}
			v.Statuses += c + ": " + strconv.FormatInt(r.Status[c], 10)
		}
		p.Views = append(p.Views, v)
	}
	return p
}

var statusPage = template.Must(template.New("status").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="5">
<title>Sluice {{.Node}}</title>
<style>
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
.bad{color:#b00}.ok{color:#070}small{color:#666}
</style></head><body>
<h1>Sluice {{.Node}} <small>region {{.Region}}, up {{.UptimeS}} s, {{.InFlight}} in flight</small></h1>
<p><small>Percentiles over sliding windows (4% bins); refreshes every 5 s. JSON: <a href="/debug/stats">/debug/stats</a>, Prometheus: <a href="/metrics">/metrics</a>.</small></p>
{{range .Views}}
<h2>Route {{.Route}} <small>{{.Req1m}} requests in 1 min, {{.Req5m}} in 5 min; status {{.Statuses}}</small></h2>
<table><tr><th>stage (ms)</th><th>1m p50</th><th>1m p95</th><th>1m p99</th><th>5m p50</th><th>5m p95</th><th>5m p99</th><th>5m n</th></tr>
{{range .Stages}}<tr><td>{{.Stage}}</td><td>{{.W1m.P50}}</td><td>{{.W1m.P95}}</td><td>{{.W1m.P99}}</td><td>{{.W5m.P50}}</td><td>{{.W5m.P95}}</td><td>{{.W5m.P99}}</td><td>{{.W5m.N}}</td></tr>
{{end}}</table>
{{else}}<p>No requests yet.</p>{{end}}
<h2>Backends</h2>
<table><tr><th>pool</th><th>backend</th><th>health</th><th>in flight</th><th>engine running</th><th>engine waiting</th><th>slots</th><th>sample age ms</th><th>score</th></tr>
{{range .Backends}}<tr><td>{{.Pool}}</td><td>{{.URL}}</td><td>{{if .Healthy}}<span class="ok">healthy</span>{{else}}<span class="bad">ejected</span>{{end}}</td><td>{{.InFlight}}</td><td>{{with .Running}}{{.}}{{else}}?{{end}}</td><td>{{with .Waiting}}{{.}}{{else}}?{{end}}</td><td>{{with .Capacity}}{{.}}{{else}}?{{end}}</td><td>{{with .SampleAgeMS}}{{printf "%.0f" .}}{{else}}stale{{end}}</td><td>{{printf "%.2f" .Score}}</td></tr>
{{end}}</table>
<h2>Edge admission queues</h2>
<table><tr><th>pool</th><th>class</th><th>waiting</th></tr>
{{range .Queues}}<tr><td>{{.Pool}}</td><td>{{.Class}}</td><td>{{.Depth}}</td></tr>
{{end}}</table>
<h2>Tenants nearest their limits</h2>
<table><tr><th>tenant</th><th>remaining</th><th>limit</th><th>refused</th><th>seen</th></tr>
{{range .Tenants}}<tr><td>{{.Tenant}}</td><td>{{.Remaining}}</td><td>{{.Limit}}</td><td>{{.Refused}}</td><td>{{.SeenAgoS}} s ago</td></tr>
{{else}}<tr><td colspan="5">none in the last 5 minutes</td></tr>{{end}}</table>
</body></html>
`))
