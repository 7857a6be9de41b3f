package observe

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"html/template"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

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

// AdminGuard protects the admin listener from anyone who merely reaches
// its port, from web pages in an operator's browser (CSRF) and from DNS
// rebinding. Every request, in this order:
//
//   - Host must be an IP literal, "localhost", or one of Hosts (case-insensitive, port ignored), else
//     421. An IP literal cannot be rebound: a page can only reach it from
//     its own origin, which then is that address.
//   - Sec-Fetch-Site "cross-site" or "same-site" is refused with 403 on any
//     method; a state-changing method (POST, PUT, DELETE, PATCH) whose
//     Origin does not match Host is refused with 403 (net/http's
//     CrossOriginProtection).
//   - When Token returns a token, every path but OpenPaths needs
//     "Authorization: Bearer <token>" (compared in constant time), else
//     401. When Token fails, those paths get 503: the guard fails closed.
//
// The zero value checks Host and Origin only. Its methods are safe for
// simultaneous use by multiple goroutines when its functions are.
type AdminGuard struct {
	// Hosts returns the host names (without port) allowed in Host besides
	// IP literals and localhost. Nil means none.
	Hosts func() []string
	// Token returns the bearer token the listener requires, "" for none.
	// Nil means none.
	Token func() (string, error)
}

// OpenPaths are the admin paths served without a token: health and
// metrics, for load balancers and scrapers.
var OpenPaths = []string{"/healthz", "/readyz", "/metrics"}

var crossOrigin = http.NewCrossOriginProtection()

// Wrap returns h behind the guard.
func (g AdminGuard) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.hostAllowed(r.Host) {
			http.Error(w, "misdirected request: this admin listener does not serve host "+strconv.Quote(r.Host)+
				" (allowed: IP addresses, localhost and admin.hosts)", http.StatusMisdirectedRequest)
			return
		}
		switch r.Header.Get("Sec-Fetch-Site") {
		case "cross-site", "same-site":
			http.Error(w, "forbidden: cross-site request to the admin listener", http.StatusForbidden)
			return
		}
		if err := crossOrigin.Check(r); err != nil {
			http.Error(w, "forbidden: "+err.Error(), http.StatusForbidden)
			return
		}
		if !slices.Contains(OpenPaths, r.URL.Path) && g.Token != nil {
			token, err := g.Token()
			if err != nil {
				http.Error(w, "admin token unavailable", http.StatusServiceUnavailable)
				return
			}
			if token != "" && !bearerMatches(r.Header.Get("Authorization"), token) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="sluice-admin"`)
				http.Error(w, "unauthorized: send Authorization: Bearer <admin token>", http.StatusUnauthorized)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// bearerMatches compares the request's bearer token with token in time
// that depends on neither (both are hashed first).
func bearerMatches(header, token string) bool {
	scheme, got, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		got = ""
	}
	a, b := sha256.Sum256([]byte(strings.TrimSpace(got))), sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1 && ok
}

// hostAllowed applies the Host rule of AdminGuard.
func (g AdminGuard) hostAllowed(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"), ".")
	if host == "" {
		return false
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	host = strings.ToLower(host)
	if host == "localhost" {
		return true
	}
	if g.Hosts != nil {
		for _, h := range g.Hosts() {
			if strings.EqualFold(strings.TrimSuffix(h, "."), host) {
				return true
			}
		}
	}
	return false
}
