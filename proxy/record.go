package proxy

import (
	"time"

	"github.com/sluice-proxy/sluice/proxy/observe"
)

// observe records a finished request in metrics, stats and the access log.
func (h *Handler) observe(x *exchange) {
	r := x.record(time.Now())
	h.metrics.Record(&r)
	h.stats.Record(&r)
	h.access.Write(&r)
}

// record describes the finished request for the observers. Its ITL slice
// is the exchange's own, valid until the exchange releases it.
func (x *exchange) record(end time.Time) observe.Record {
	r := observe.Record{ID: x.id, Method: x.r.Method, Path: x.r.URL.Path, Proto: protoOf(x.r, x.conn),
		Model: x.meta.Model, Status: x.status, Start: x.start, End: end,
		BytesIn: int64(max(len(x.body), x.bodyLen)), BytesOut: x.bytesToUser, Retries: x.retries, Hedged: x.hedged,
		Usage: x.consumed(), Counted: x.usage != nil || x.tokens > 0, Error: errorClass(x),
		Client: clientIP(x.r), TraceID: x.traceID()}
	if r.Status == 0 {
		r.Status = 499
	}
	if x.tenant != nil {
		r.Tenant, r.Decision = x.tenant.ID, x.decision
	}
	if x.route != nil {
		r.Route = x.route.Name
		if x.backend != nil {
			r.Pool, r.Backend = x.route.Pool.Name(), x.backend.URL.Host
		}
	}
	for i, name := range observe.Timed {
		r.Stages[i], r.Measured[i] = x.stage(name)
	}
	if x.itl != nil {
		r.ITL = *x.itl
	}
	return r
}

// errorClass names the kind of failure for logs: "" when none.
func errorClass(x *exchange) string {
	switch {
	case x.err == nil:
		return ""
	case x.decision.Reason != "" && !x.decision.Allowed:
		return "limit_" + x.decision.Reason
	}
	return ErrorOf(x.err).Code
}

// Snapshot returns the node's current stats (the JSON of /debug/stats).
func (h *Handler) Snapshot() observe.StatsSnapshot {
	n := observe.Node{Name: h.node, Region: h.region, Started: h.started, InFlight: h.inflight.Load(),
		SLO: h.State().Config.SLO}
	return observe.Snapshot(n, h.stats, h.State().Routes.Pools(), time.Now())
}
