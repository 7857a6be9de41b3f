package observe

import (
	"net/url"
	"time"

	"github.com/sluice-proxy/sluice/routing"
)

// SLO is a node's service-level objectives; `sluice diagnose` exits
// non-zero when a window breaches one. Zero fields are not checked.
type SLO struct {
	// TTFTP95 bounds the P95 time to first token.
	TTFTP95 time.Duration `yaml:"ttft_p95" json:"-"`
	// ITLP99 bounds the P99 inter-token latency.
	ITLP99 time.Duration `yaml:"itl_p99" json:"-"`
	// E2EP99 bounds the P99 request duration.
	E2EP99 time.Duration `yaml:"e2e_p99" json:"-"`
}

// SLOMillis is an SLO in the JSON of /debug/stats.
type SLOMillis struct {
	TTFTP95 float64 `json:"ttft_p95_ms,omitempty"`
	ITLP99  float64 `json:"itl_p99_ms,omitempty"`
	E2EP99  float64 `json:"e2e_p99_ms,omitempty"`
}

// BackendStat is one backend's load and health.
type BackendStat struct {
	Pool     string `json:"pool"`
	URL      string `json:"url"`
	Healthy  bool   `json:"healthy"`
	InFlight int64  `json:"in_flight"`
	// Running and Waiting are the engine's own gauges when scraped; nil
	// when unknown. Capacity is the engine's batch slots when configured.
	Running  *float64 `json:"running,omitempty"`
	Waiting  *float64 `json:"waiting,omitempty"`
	Capacity int      `json:"capacity,omitempty"`
	// SampleAgeMS is the age of the engine sample used; absent when none
	// is fresh (the load is then this node's in-flight count alone).
	SampleAgeMS *float64 `json:"sample_age_ms,omitempty"`
	// Score is the least-queued score (lower is better).
	Score float64 `json:"score"`
	// TTFT prediction (routing.PredictConfig): the measured prefill rate
	// (tokens/s) and queue wait per waiting request (the priors until
	// measured), and the P50/P95 of predicted − actual TTFT in ms over
	// PredErrors predictions (bucket upper bounds; absent before any).
	PrefillRate  float64  `json:"prefill_tokens_per_s"`
	QueueWaitMS  float64  `json:"queue_wait_per_request_ms"`
	PredErrors   int64    `json:"ttft_predictions,omitempty"`
	PredErrP50MS *float64 `json:"ttft_prediction_error_p50_ms,omitempty"`
	PredErrP95MS *float64 `json:"ttft_prediction_error_p95_ms,omitempty"`
}

// QueueStat is one pool's edge admission queue depth for a class.
type QueueStat struct {
	Pool  string `json:"pool"`
	Class string `json:"class"`
	Depth int    `json:"depth"`
}

// StatsSnapshot is the JSON of /debug/stats.
type StatsSnapshot struct {
	Node        string        `json:"node"`
	Region      string        `json:"region"`
	GeneratedAt time.Time     `json:"generated_at"`
	UptimeS     float64       `json:"uptime_s"`
	InFlight    int64         `json:"in_flight"`
	SLO         SLOMillis     `json:"slo"`
	Routes      []RouteStats  `json:"routes"`
	Backends    []BackendStat `json:"backends"`
	Queues      []QueueStat   `json:"queues"`
	Tenants     []TenantStat  `json:"tenants_nearest_limits"`
}

// Node describes the node a snapshot is of.
type Node struct {
	Name, Region string
	Started      time.Time
	// InFlight is the requests being served now.
	InFlight int64
	SLO      SLO
}

// Snapshot returns the node's current stats at now: the windows of st
// (nil: none) and the load and health of every backend of pools, with
// their admission queues.
func Snapshot(n Node, st *Stats, pools []*routing.Pool, now time.Time) StatsSnapshot {
	slo := n.SLO
	snap := StatsSnapshot{
		Node: n.Name, Region: n.Region, GeneratedAt: now.UTC(), UptimeS: now.Sub(n.Started).Round(time.Second).Seconds(),
		InFlight: n.InFlight,
		SLO:      SLOMillis{TTFTP95: millis(slo.TTFTP95), ITLP99: millis(slo.ITLP99), E2EP99: millis(slo.E2EP99)},
		Routes:   []RouteStats{}, Backends: []BackendStat{}, Queues: []QueueStat{}, Tenants: []TenantStat{},
	}
	if st != nil {
		snap.Routes = st.routesSnapshot()
		snap.Tenants = st.nearestTenants(10)
	}
	for _, p := range pools {
		for _, b := range p.Backends() {
			snap.Backends = append(snap.Backends, backendStat(p.Name(), b, now))
		}
		for _, class := range []string{routing.ClassInteractive, routing.ClassBatch} {
			snap.Queues = append(snap.Queues, QueueStat{Pool: p.Name(), Class: class, Depth: p.QueueLen(class)})
		}
	}
	return snap
}

func millis(d time.Duration) float64 { return float64(d) / 1e6 }

// backendStat describes one backend's health and load at now.
func backendStat(pool string, b *routing.Backend, now time.Time) BackendStat {
	bs := BackendStat{Pool: pool, URL: publicURL(b.URL), Healthy: b.Healthy(now), InFlight: b.InFlight(),
		Capacity: b.Config.MaxBatch, Score: b.Score(now)}
	if l := b.Load(now); l.Known && l.Sample != nil {
		running, waiting := l.Sample.Running, l.Sample.Waiting
		age := millis(now.Sub(l.Sample.At))
		bs.Running, bs.Waiting, bs.SampleAgeMS = &running, &waiting, &age
	}
	ps := b.PredictStats()
	bs.PrefillRate, bs.QueueWaitMS, bs.PredErrors = ps.PrefillRate, millis(ps.QueueWait), ps.Errors
	if ps.Errors > 0 {
		p50, p95 := millis(ps.ErrP50), millis(ps.ErrP95)
		bs.PredErrP50MS, bs.PredErrP95MS = &p50, &p95
	}
	return bs
}

// publicURL is u without its user info ("user:pass@"), for the status
// page and /debug/stats: credentials in a backend URL are never shown.
func publicURL(u *url.URL) string {
	if u == nil {
		return ""
	}
	if u.User == nil {
		return u.String()
	}
	c := *u
	c.User = nil
	return c.String()
}
