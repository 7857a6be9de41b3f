package routing

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// RegisterMetrics registers Collector(pools) with reg.
func RegisterMetrics(reg prometheus.Registerer, pools func() []*Pool) error {
	return reg.Register(Collector(pools))
}

// Collector returns a collector that exports, at scrape time, the state of
// the pools that pools returns (called on every scrape, so a config reload
// that replaces the pools is followed): per backend the load score, the
// engine's gauges from the freshest sample and its age, in-flight
// requests, health, ejections, scrape and probe failures; per pool and
// class the admission queue's depth, wait histogram and outcomes. It is
// unchecked: it describes no metrics up front.
func Collector(pools func() []*Pool) prometheus.Collector {
	return &collector{pools: pools}
}

var (
	backendLabels = []string{"pool", "backend"}
	descScore     = prometheus.NewDesc("sluice_backend_score",
		"Load score used by least_queued (lower is better).", backendLabels, nil)
	descInflight = prometheus.NewDesc("sluice_backend_inflight_requests",
		"This node's requests in flight to the backend.", backendLabels, nil)
	descEstimated = prometheus.NewDesc("sluice_backend_estimated_requests",
		"Estimated requests at the engine (running + waiting), own in-flight when unknown.", backendLabels, nil)
	descWaiting = prometheus.NewDesc("sluice_backend_engine_waiting",
		"Waiting requests in the freshest engine sample.", backendLabels, nil)
	descRunning = prometheus.NewDesc("sluice_backend_engine_running",
		"Running requests in the freshest engine sample.", backendLabels, nil)
	descKVRatio = prometheus.NewDesc("sluice_backend_engine_kv_cache_usage_ratio",
		"KV-cache usage (0-1) in the freshest engine sample.", backendLabels, nil)
	// descKV is descKVRatio's name before the _ratio suffix, still exported
	// for one release (see docs/OPERATIONS.md, "Metric renames").
	descKV = prometheus.NewDesc("sluice_backend_engine_kv_cache_usage",
		"Deprecated: use sluice_backend_engine_kv_cache_usage_ratio (same value).", backendLabels, nil)
	descAge = prometheus.NewDesc("sluice_backend_sample_age_seconds",
		"Age of the backend's latest load sample by source (scrape, header).", append(backendLabels, "source"), nil)
	descHealthy = prometheus.NewDesc("sluice_backend_healthy",
		"1 when the backend is in rotation.", backendLabels, nil)
	descEjections = prometheus.NewDesc("sluice_backend_ejections_total",
		"Times the backend was taken out of rotation, by reason (passive, probe).", append(backendLabels, "reason"), nil)
	descScrapeErrors = prometheus.NewDesc("sluice_backend_scrape_errors_total",
		"Failed reads of the backend's metrics.", backendLabels, nil)
	descProbeFailures = prometheus.NewDesc("sluice_backend_probe_failures_total",
		"Failed health probes of the backend.", backendLabels, nil)
	descProbeExcused = prometheus.NewDesc("sluice_backend_probe_timeouts_excused_total",
		"Health probes that timed out while the backend was still answering requests (not counted as failures).", backendLabels, nil)
	descDepth = prometheus.NewDesc("sluice_queue_depth",
		"Requests waiting in the pool's admission queue.", []string{"pool", "class"}, nil)
	descPrefixPicks = prometheus.NewDesc("sluice_prefix_picks_total",
		"prefix_aware picks of requests with a prompt, by result: hit (the backend chosen was expected to hold some of the prompt's blocks) or miss.",
		[]string{"pool", "result"}, nil)
	descPrefixBlocks = prometheus.NewDesc("sluice_prefix_blocks_total",
		"Prompt blocks of prefix_aware picks, by result: hit (expected cached on the backend chosen) or miss; hit / (hit + miss) is the block hit ratio.",
		[]string{"pool", "result"}, nil)
	descPrefixEntries = prometheus.NewDesc("sluice_prefix_table_entries",
		"Block hashes held in the pool's prefix table.", []string{"pool"}, nil)
	descPrefixShared = prometheus.NewDesc("sluice_prefix_shared_total",
		"Prefix table operations through Redis, by result: found (a lookup that found a block), miss, error (a lookup or write batch that failed or timed out), dropped (writes dropped with the queue full).",
		[]string{"pool", "result"}, nil)
	descSessionPicks = prometheus.NewDesc("sluice_session_picks_total",
		"Picks of requests with a session key, by result: pinned (to the session's own backend) or moved (it was unavailable, tried or overloaded).",
		[]string{"pool", "result"}, nil)
	descPredErr = prometheus.NewDesc("sluice_backend_ttft_prediction_error_seconds",
		"Predicted minus actual time to first token (pick to first streamed event) of the backend's requests; negative: the prediction was low.",
		backendLabels, nil)
	descPrefillRate = prometheus.NewDesc("sluice_backend_prefill_tokens_per_second",
		"Measured prefill rate used by the TTFT prediction (the configured prior until measured).", backendLabels, nil)
	descQueueWaitPer = prometheus.NewDesc("sluice_backend_queue_wait_per_request_seconds",
		"Measured engine queue wait per waiting request used by the TTFT prediction (the prior until measured).", backendLabels, nil)
	descObjectiveRefused = prometheus.NewDesc("sluice_ttft_objective_refusals_total",
		"Requests refused (503) because every backend was predicted to miss their route's ttft_objective.", []string{"pool"}, nil)
	descOutcomes = prometheus.NewDesc("sluice_queue_requests_total",
		"Requests through the admission queue by outcome (immediate, waited, timeout, cancelled, full).",
		[]string{"pool", "class", "outcome"}, nil)
)

// collector reads the pools' state at scrape time. It is unchecked (it
// describes nothing) because the pools and backends change with reloads.
type collector struct {
	pools func() []*Pool
}

func (c *collector) Describe(chan<- *prometheus.Desc) {}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	for _, p := range c.pools() {
		for _, b := range p.backends {
			collectBackend(ch, p, b, now)
		}
		collectAffinity(ch, p)
		ch <- prometheus.MustNewConstMetric(descObjectiveRefused, prometheus.CounterValue, float64(p.objRefused.Load()), p.cfg.Name)
		q := p.queue
		for cl := range q.classes {
			ch <- prometheus.MustNewConstMetric(descDepth, prometheus.GaugeValue, float64(q.depth[cl].Load()), p.cfg.Name, classNames[cl])
			for o := range outcomeNames {
				ch <- prometheus.MustNewConstMetric(descOutcomes, prometheus.CounterValue,
					float64(q.outcomes[cl][o].Load()), p.cfg.Name, classNames[cl], outcomeNames[o])
			}
			q.waits[cl].Collect(ch)
		}
	}
}

func collectBackend(ch chan<- prometheus.Metric, p *Pool, b *Backend, now time.Time) {
	lv := []string{p.cfg.Name, b.label}
	gauge := func(d *prometheus.Desc, v float64, extra ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append(lv, extra...)...)
	}
	counter := func(d *prometheus.Desc, v int64, extra ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append(lv, extra...)...)
	}
	l := b.Load(now)
	gauge(descScore, l.score(b))
	gauge(descInflight, float64(l.InFlight))
	gauge(descEstimated, l.Total)
	if s := l.Sample; s != nil {
		gauge(descWaiting, s.Waiting)
		gauge(descRunning, s.Running)
		if s.KVCache >= 0 {
			gauge(descKVRatio, s.KVCache)
			gauge(descKV, s.KVCache)
		}
	}
	for _, s := range []*Sample{b.scraped.Load(), b.header.Load()} {
		if s != nil {
			gauge(descAge, now.Sub(s.At).Seconds(), s.Source)
		}
	}
	healthy := 0.0
	if b.Healthy(now) {
		healthy = 1
	}
	gauge(descHealthy, healthy)
	counter(descEjections, b.passiveEjections.Load(), "passive")
	counter(descEjections, b.probeEjections.Load(), "probe")
	counter(descScrapeErrors, b.scrapeErrors.Load())
	counter(descProbeFailures, b.probeFailures.Load())
	counter(descProbeExcused, b.probeExcused.Load())
	ps := b.PredictStats()
	gauge(descPrefillRate, ps.PrefillRate)
	gauge(descQueueWaitPer, ps.QueueWait.Seconds())
	buckets := make(map[float64]uint64, len(errBounds))
	for i, v := range errBounds {
		buckets[v/1000] = ps.Buckets[i]
	}
	ch <- prometheus.MustNewConstHistogram(descPredErr, uint64(ps.Errors), ps.SumSec, buckets, lv...)
}

func collectAffinity(ch chan<- prometheus.Metric, p *Pool) {
	a := p.aff
	counter := func(d *prometheus.Desc, v int64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append([]string{p.cfg.Name}, lv...)...)
	}
	if a.table != nil {
		hits, blocksHit := a.hits.Load(), a.blocksHit.Load()
		counter(descPrefixPicks, hits, "hit")
		counter(descPrefixPicks, a.lookups.Load()-hits, "miss")
		counter(descPrefixBlocks, blocksHit, "hit")
		counter(descPrefixBlocks, a.blocksAsked.Load()-blocksHit, "miss")
		ch <- prometheus.MustNewConstMetric(descPrefixEntries, prometheus.GaugeValue, float64(a.table.len()), p.cfg.Name)
	}
	if st := a.shared; st != nil {
		found, failed := st.found.Load(), st.failed.Load()
		counter(descPrefixShared, found, "found")
		counter(descPrefixShared, max(st.lookups.Load()-found-failed, 0), "miss")
		counter(descPrefixShared, failed, "error")
		counter(descPrefixShared, st.dropped.Load(), "dropped")
	}
	if a.cfg.SessionHeader != "" {
		counter(descSessionPicks, a.sessionPinned.Load(), "pinned")
		counter(descSessionPicks, a.sessionMoved.Load(), "moved")
	}
}
