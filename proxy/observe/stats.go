package observe

import (
	"math"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-proxy/sluice/limiter"
)

// Sliding-window percentiles for /debug/stats and the status page. Each
// (route, stage) keeps a ring of 10-second slots; each slot is a log-scale
// histogram with 4% wide bins from 10 µs to over an hour, so a percentile
// is exact to within 4% over exactly the last minute or five minutes, with
// bounded memory (about 2 KiB per slot, allocated when used).

const (
	slotSeconds = 10
	slotCount   = 30 // five minutes
	histBins    = 512
	histBase    = 10e-6 // seconds: the first bin's lower bound
	histGrowth  = 1.04
)

var logGrowth = math.Log(histGrowth)

// hist is one slot's histogram.
type hist struct {
	epoch  int64 // slot start, unix seconds / slotSeconds
	n      uint32
	counts [histBins]uint32
}

func binOf(seconds float64) int {
	if seconds <= histBase {
		return 0
	}
	return min(int(math.Log(seconds/histBase)/logGrowth), histBins-1)
}

// binValue is a bin's geometric midpoint in seconds.
func binValue(i int) float64 { return histBase * math.Pow(histGrowth, float64(i)+0.5) }

// series is one (route, stage) ring of slots.
type series struct{ slots [slotCount]*hist }

func (s *series) add(epoch int64, seconds float64) {
	i := epoch % slotCount
	h := s.slots[i]
	if h == nil {
		h = &hist{}
		s.slots[i] = h
	}
	if h.epoch != epoch {
		*h = hist{epoch: epoch}
	}
	h.counts[binOf(seconds)]++
	h.n++
}

// Percentiles are the P50, P95 and P99 of a window, in milliseconds.
type Percentiles struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_ms"`
	P95 float64 `json:"p95_ms"`
	P99 float64 `json:"p99_ms"`
}

// window merges the slots of the last `slots` slots up to epoch.
func (s *series) window(epoch int64, slots int) Percentiles {
	var merged [histBins]uint32
	var n uint64
	for _, h := range s.slots {
		if h == nil || h.epoch <= epoch-int64(slots) || h.epoch > epoch {
			continue
		}
		for i, c := range h.counts {
			merged[i] += c
		}
		n += uint64(h.n)
	}
	if n == 0 {
		return Percentiles{}
	}
	rank := func(p float64) float64 {
		target := uint64(math.Ceil(p * float64(n)))
		var cum uint64
		for i, c := range merged {
			cum += uint64(c)
			if cum >= target {
				return math.Round(binValue(i)*1e6) / 1e3
			}
		}
		return math.Round(binValue(histBins-1)*1e6) / 1e3
	}
	return Percentiles{N: int(n), P50: rank(0.50), P95: rank(0.95), P99: rank(0.99)}
}

// statStages are the stages kept per route, with the ITL samples and the
// end-to-end duration.
var statStages = append(append([]string{}, Timed[:]...), StageITL, StageE2E)

// routeStats holds one route's series.
type routeStats struct {
	series map[string]*series
	status map[int]int64 // lifetime counts by status
}

// tenantSeen is what the stats remember of a tenant's last admission.
type tenantSeen struct {
	at        time.Time
	remaining float64 // smallest remaining/limit over its limits, 0..1
	limit     string  // which limit that was
	refused   int64
}

// Stats keeps sliding-window percentiles per route and stage, and the
// tenants nearest their limits. It is safe for simultaneous use by multiple
// goroutines. The zero value is not usable; call NewStats.
type Stats struct {
	mu      sync.Mutex
	routes  map[string]*routeStats
	tenants map[string]*tenantSeen
	now     func() time.Time
}

// maxTenantsSeen bounds the tenant table; the stalest entries go first.
const maxTenantsSeen = 10000

// NewStats returns empty stats.
func NewStats() *Stats {
	return &Stats{routes: map[string]*routeStats{}, tenants: map[string]*tenantSeen{}, now: time.Now}
}

// Record adds a finished request that matched a route to the windows. A
// nil *Stats records nothing.
func (s *Stats) Record(r *Record) {
	if s == nil || r.Route == "" {
		return
	}
	epoch := r.End.Unix() / slotSeconds
	s.mu.Lock()
	defer s.mu.Unlock()
	rs := s.routes[r.Route]
	if rs == nil {
		rs = &routeStats{series: map[string]*series{}, status: map[int]int64{}}
		s.routes[r.Route] = rs
	}
	add := func(stage string, d time.Duration) {
		se := rs.series[stage]
		if se == nil {
			se = &series{}
			rs.series[stage] = se
		}
		se.add(epoch, d.Seconds())
	}
	for i, d := range r.Stages {
		if r.Measured[i] {
			add(Timed[i], d)
		}
	}
	add(StageE2E, r.End.Sub(r.Start))
	for _, us := range r.ITL {
		add(StageITL, time.Duration(us)*time.Microsecond)
	}
	rs.status[r.Status]++
	if d := &r.Decision; r.Tenant != "" && (d.Ticket != nil || d.Reason != "") {
		s.seeTenant(r.Tenant, d, r.End)
	}
}

// seeTenant remembers how close a tenant's last admission came to a limit.
func (s *Stats) seeTenant(tenant string, d *limiter.Decision, end time.Time) {
	ts := s.tenants[tenant]
	if ts == nil {
		if len(s.tenants) >= maxTenantsSeen {
			s.evictStalest()
		}
		ts = &tenantSeen{}
		s.tenants[tenant] = ts
	}
	ts.at, ts.remaining, ts.limit = end, 1, ""
	for name, q := range map[string]struct{ l, r int64 }{
		"requests": {d.Requests.Limit, d.Requests.Remaining}, "tokens": {d.Tokens.Limit, d.Tokens.Remaining},
		"concurrency": {d.Concurrency.Limit, d.Concurrency.Remaining},
	} {
		if q.l > 0 {
			if f := float64(q.r) / float64(q.l); f < ts.remaining || ts.limit == "" {
				ts.remaining, ts.limit = f, name
			}
		}
	}
	if !d.Allowed || d.WouldRefuse {
		ts.refused++
	}
}

func (s *Stats) evictStalest() {
	var oldest string
	var at time.Time
	for id, t := range s.tenants {
		if oldest == "" || t.at.Before(at) {
			oldest, at = id, t.at
		}
	}
	delete(s.tenants, oldest)
}

// RouteWindow is one route's stage percentiles over a window.
type RouteWindow struct {
	Requests int                    `json:"requests"`
	Stages   map[string]Percentiles `json:"stages"`
}

// RouteStats is one route's entry in StatsSnapshot.
type RouteStats struct {
	Route   string                 `json:"route"`
	Windows map[string]RouteWindow `json:"windows"` // "1m", "5m"
	Status  map[string]int64       `json:"status"`  // lifetime counts by status code
}

// TenantStat is a tenant near its limits.
type TenantStat struct {
	Tenant    string  `json:"tenant"`
	Remaining float64 `json:"remaining_fraction"`
	Limit     string  `json:"nearest_limit"`
	Refused   int64   `json:"refused"`
	SeenAgoS  float64 `json:"seen_ago_s"`
}

// routesSnapshot computes every route's windows.
func (s *Stats) routesSnapshot() []RouteStats {
	now := s.now()
	epoch := now.Unix() / slotSeconds
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]RouteStats, 0, len(s.routes))
	for name, rs := range s.routes {
		r := RouteStats{Route: name, Windows: map[string]RouteWindow{}, Status: map[string]int64{}}
		for label, slots := range map[string]int{"1m": 60 / slotSeconds, "5m": slotCount} {
			w := RouteWindow{Stages: map[string]Percentiles{}}
			for _, st := range statStages {
				if se := rs.series[st]; se != nil {
					if p := se.window(epoch, slots); p.N > 0 {
						w.Stages[st] = p
					}
				}
			}
			w.Requests = w.Stages[StageE2E].N
			r.Windows[label] = w
		}
		for code, n := range rs.status {
			r.Status[strconv.Itoa(code)] = n
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Route < out[j].Route })
	return out
}

// nearestTenants lists up to n tenants seen in the last five minutes, the
// closest to a limit first.
func (s *Stats) nearestTenants(n int) []TenantStat {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []TenantStat
	for id, t := range s.tenants {
		if now.Sub(t.at) > slotCount*slotSeconds*time.Second || t.limit == "" {
			continue
		}
		out = append(out, TenantStat{Tenant: id, Remaining: math.Round(t.remaining*1000) / 1000, Limit: t.limit,
			Refused: t.refused, SeenAgoS: math.Round(now.Sub(t.at).Seconds()*10) / 10})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Remaining != out[j].Remaining {
			return out[i].Remaining < out[j].Remaining
		}
		return out[i].Tenant < out[j].Tenant
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}
