package observe

import (
	"math"
	"slices"
	"time"

	"github.com/sluice-proxy/sluice/limiter"
)

// Stages reported in Server-Timing, metrics, the access log and /debug/stats.
// Each is a duration between two marks of the request's timeline; see
// docs/TIMING.md for the exact definitions.
const (
	StageNetRTT   = "net-rtt"  // transport round-trip time estimate
	StageTLS      = "tls"      // TLS/QUIC handshake, first request of a connection
	StageAuth     = "auth"     // request start → tenant known
	StageRecv     = "recv"     // → request body read
	StageRoute    = "route"    // → body parsed, route matched
	StageLimit    = "limit"    // → limiter decision
	StageQueue    = "queue"    // edge admission queue wait
	StageUpstream = "upstream" // backend picked → backend response headers (all attempts)
	StagePrefill  = "prefill"  // backend headers → first token
	StageTTFT     = "ttft"     // request start → first token read from the backend
	StageEdge     = "edge"     // Sluice's own share of ttft
	StageDecode   = "decode"   // first token → last token
	StageHold     = "hold"     // first token read → its first write to the client returned (final timing only)
	StageE2E      = "e2e"      // request start → end
	StageITL      = "itl"      // inter-token latency (one sample per gap)
)

// HeaderStages are the stages of the initial Server-Timing header, in order.
var HeaderStages = [...]string{StageNetRTT, StageTLS, StageAuth, StageRecv, StageRoute, StageLimit,
	StageQueue, StageUpstream, StagePrefill, StageTTFT, StageEdge}

// Timed are the stages a Record carries, indexed like Record.Stages: the
// header stages, then decode.
var Timed = [...]string{StageNetRTT, StageTLS, StageAuth, StageRecv, StageRoute, StageLimit,
	StageQueue, StageUpstream, StagePrefill, StageTTFT, StageEdge, StageDecode}

// Indexes into Timed and Record.Stages of the stages read on their own.
const (
	TTFT   = 9
	Decode = len(Timed) - 1
)

// Record describes one finished request: what every observer reads. The
// pipeline fills it once when the request ends; observers must not keep
// it (or its ITL slice) after the call that receives it.
type Record struct {
	ID, Tenant, Method, Path, Proto, Model string
	// Route is the matched route's name; empty when none matched. Pool and
	// Backend (host:port) are empty when no backend was used.
	Route, Pool, Backend string
	// Status is the response status; 499 when the client left first.
	Status     int
	Start, End time.Time
	// Stages holds each timed stage's duration, indexed like Timed;
	// Measured says which were measured.
	Stages   [len(Timed)]time.Duration
	Measured [len(Timed)]bool
	// ITL holds the inter-token gaps in microseconds, in order.
	ITL []uint32
	// Usage is what the request consumed (the backend's report, else the
	// prompt estimate plus the tokens relayed); Counted is false when no
	// token was seen at all.
	Usage   limiter.Usage
	Counted bool
	// BytesIn is the request body's size, BytesOut what was written to the
	// client.
	BytesIn, BytesOut int64
	Retries           int
	Hedged            bool
	// Decision is the limiter's decision; the zero Decision when none
	// decided.
	Decision limiter.Decision
	// Error classifies a failure ("upstream_timeout", "limit_tokens");
	// empty when none.
	Error string
	// Client is the client's address (the connection's peer, no port).
	Client string
	// TraceID is the request's W3C trace id (32 hex digits); empty when
	// it has none (see docs/TIMING.md "Traces").
	TraceID string
}

// ITLPercentiles returns the P50, P99 and max of inter-token gaps given in
// microseconds, and their count.
func ITLPercentiles(itl []uint32) (p50, p99, maxd time.Duration, n int) {
	if len(itl) == 0 {
		return 0, 0, 0, 0
	}
	s := slices.Clone(itl)
	slices.Sort(s)
	rank := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return time.Duration(s[max(i, 0)]) * time.Microsecond
	}
	return rank(0.50), rank(0.99), time.Duration(s[len(s)-1]) * time.Microsecond, len(s)
}

// routeLabel is the route's name in metrics and logs: "-" when none.
func (r *Record) routeLabel() string {
	if r.Route == "" {
		return "-"
	}
	return r.Route
}
