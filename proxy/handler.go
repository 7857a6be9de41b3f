package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/proxy/listen"
	"github.com/sluice-proxy/sluice/proxy/observe"
	"github.com/sluice-proxy/sluice/proxy/tracing"
	"github.com/sluice-proxy/sluice/routing"
)

// Limiter admits and settles requests against tenant limits; see
// limiter.Limiter.
type Limiter interface {
	Admit(ctx context.Context, req limiter.Request) (limiter.Decision, error)
	Settle(ctx context.Context, t *limiter.Ticket, u limiter.Usage) error
}

// State is the part of the handler that a config reload replaces as a whole.
type State struct {
	Config  Config
	Tenants *Tenants
	Routes  *routing.Table
	// Policies are the pipeline policies of Routes' routes, keyed by the
	// *routing.Route that Routes.Match returns (a lookup that does not
	// allocate), with defaults applied. A route without an entry gets
	// RoutePolicy{}.WithDefaults().
	Policies map[*routing.Route]*RoutePolicy
	// Limiter enforces tenant limits. Nil means no limits.
	Limiter Limiter
	// Transports carry requests to each pool's backends, keyed by pool
	// name (see NewPoolTransport). A pool without one uses the handler's
	// transport.
	Transports map[string]http.RoundTripper
	// Pickers hand out the attempts on each pool's backends, keyed by
	// pool name. A pool without one is its own picker (routing.Pool's
	// Acquire); tests put fakes here.
	Pickers map[string]Picker
}

// Options configures a Handler.
type Options struct {
	// Node names this node in /debug/stats.
	Node string
	// Region is sent to clients as X-Sluice-Region. Empty means none.
	Region string
	// Log receives errors. Nil means slog.Default().
	Log *slog.Logger
	// AccessLog receives one line per request. Nil means none.
	AccessLog *observe.AccessLog
	// Stats keeps the sliding-window percentiles of /debug/stats. Nil
	// means none.
	Stats *observe.Stats
	// Metrics records request metrics. Nil means none.
	Metrics *observe.Metrics
	// Transport carries requests to backends. Nil means NewTransport(cfg).
	Transport http.RoundTripper
	// Tracer makes each request's spans (see trace.go). Nil means
	// tracing is off.
	Tracer *tracing.Tracer
	// NoEventLoop keeps committed HTTP/1.1 streams on their goroutines
	// instead of handing them to the event loops (handoff.go); for
	// comparisons.
	NoEventLoop bool
}

// Handler is the request pipeline: intake, auth, route, admission, pick,
// forward and relay. It is safe for simultaneous use by multiple goroutines.
type Handler struct {
	live      atomic.Pointer[liveState]
	node      string
	region    string
	regionVal []string // X-Sluice-Region's value, made once: every response shares it (cap 1: an append copies)
	log       *slog.Logger
	access    *observe.AccessLog
	metrics   *observe.Metrics
	stats     *observe.Stats
	transport http.RoundTripper
	tracer    *tracing.Tracer // nil: tracing off
	started   time.Time
	inflight  atomic.Int64
	settling  sync.WaitGroup // settles still running after their response ended
	settles   *limiter.SettleQueue
	// bodies is the node's request-body memory in use; sending counts
	// each tenant's bodies being received (see body.go).
	bodies    bodyBudget
	sending   tenantBodies
	responses bodyBudget // windows of non-streamed responses being read (response_memory_bytes)
	sockets   wsSockets  // open WebSocket sockets by address and tenant (ws.go)
	loops     loops      // the event loops of committed h1 streams (handoff.go)
	noLoop    bool
}

// NewHandler builds a handler serving st.
func NewHandler(st *State, opts Options) *Handler {
	h := &Handler{node: opts.Node, region: opts.Region, log: opts.Log, access: opts.AccessLog,
		metrics: opts.Metrics, stats: opts.Stats, transport: opts.Transport, started: time.Now(),
		settles: limiter.NewSettleQueue(0, 0, time.Second), noLoop: opts.NoEventLoop}
	h.tracer = opts.Tracer
	if h.region != "" {
		h.regionVal = []string{h.region}
	}
	if h.log == nil {
		h.log = slog.Default()
	}
	if h.transport == nil {
		h.transport = NewTransport(st.Config)
	}
	st.Config = st.Config.WithDefaults()
	h.live.Store(newLiveState(st))
	return h
}

// Swap replaces the handler's state atomically: new requests use st, and
// requests already running keep the state they started with. The returned
// channel is closed once every request that used the previous state has
// finished (at once if none is running): then whatever only the previous
// state held (replaced pools, their backends) can be stopped.
func (h *Handler) Swap(st *State) (previousDone <-chan struct{}) {
	st.Config = st.Config.WithDefaults()
	old := h.live.Swap(newLiveState(st))
	return old.retire()
}

// State returns the state new requests use.
func (h *Handler) State() *State { return h.live.Load().st }

// Region is the node's region (Options.Region), sent as X-Sluice-Region;
// "" means none.
func (h *Handler) Region() string { return h.region }

// ServeHTTP runs one request through the pipeline, answering on w (see
// Serve). It does not serve the WebSocket bridge's endpoint: package
// proxy/bridge wraps the handler to do that.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.helpLoops()
	conn, _ := listen.ConnInfoFrom(r.Context())
	abortIfCut(h.serve(h.acquire(), r, nil, w, conn, false))
}

// Serve runs one request through the pipeline (auth, intake, admission,
// routing, forwarding, relay, settlement, metrics, access log), writes the
// response into sink and reports the outcome once the request has been
// settled. r's context carries cancellation; conn describes the client's
// connection. Neither Serve nor ServeHTTP upgrades the WebSocket
// bridge's endpoint; proxy/bridge does, and serves each request frame
// through Serve.
func (h *Handler) Serve(r *http.Request, sink Sink, conn listen.ConnInfo) Outcome {
	return h.serve(h.acquire(), r, sink, nil, conn, true)
}

// serve runs the exchange on l's state and releases it; timing says
// whether the outcome carries the timing object. A nil sink means an
// httpSink on w, held in the exchange. An exchange whose stream went to an
// event loop is completed by the loop (handoff.go): serve then returns at
// once, with a zero Outcome.
func (h *Handler) serve(l *liveState, r *http.Request, sink Sink, w http.ResponseWriter, conn listen.ConnInfo, timing bool) (o Outcome) {
	x := &exchange{h: h, st: l.st, live: l, sink: sink, r: r, conn: conn, start: time.Now()}
	if sink == nil {
		x.hsink = httpSink{w: w, rc: *http.NewResponseController(w)}
		x.sink = &x.hsink
		sink = x.sink
	}
	x.id = RequestID(r.Header.Get("X-Request-Id"))
	x.startTrace()
	x.ownID = x.id
	if x.id == r.Header.Get("X-Request-Id") {
		x.ownID = newID() // the client's id is kept, and Sluice's own goes beside it
	}
	hdr := sink.Header()
	x.ids = [2]string{x.id, x.ownID} // the values' slices point into the exchange: no allocation
	hdr["X-Request-Id"], hdr["X-Sluice-Request-Id"] = x.ids[0:1:1], x.ids[1:2:2]
	if h.regionVal != nil {
		hdr["X-Sluice-Region"] = h.regionVal[:1:1]
	}
	h.inflight.Add(1)
	h.metrics.Inflight(1)
	served := false
	defer func() {
		if x.loop == nil {
			o = x.complete(timing, served) // also if serve panics
		}
	}()
	if err := x.serve(); err != nil && x.loop == nil {
		x.fail(err)
	}
	served = true
	return
}

// complete ends an exchange: its request body's memory, the settle, the
// access log and the outcome, then the sink's End (the stream's held last
// event and trailer) and the counts, and last the state it used. It runs
// when serve returns, or, for a stream on an event loop, when the loop
// ended it.
func (x *exchange) complete(timing, served bool) (o Outcome) {
	h := x.h
	defer x.live.release()
	defer h.inflight.Add(-1)
	defer h.metrics.Inflight(-1)
	defer func() {
		o = x.finish(timing)
		if served {
			x.sink.End(x.trailer) // last: the held last event and the trailer leave together
		}
		x.releaseTrace() // ended and logged: back to the free list once its legs have let go too
	}()
	h.bodies.release(x.bodyMem)
	return
}

// exchange is one request's journey through the pipeline.
type exchange struct {
	h    *Handler
	st   *State
	live *liveState // st's holder, kept acquired by a background settle
	sink Sink
	r    *http.Request
	id   string // X-Request-Id: the client's when it passed RequestID, else ownID
	// ownID is always generated by Sluice (X-Sluice-Request-Id): unique
	// even when clients reuse or collide their ids. It is also the
	// limiter's idempotency id (admit).
	ownID string
	err   error
	// Storage the request's fields point into, so that setting them does
	// not allocate: ids holds the values of X-Request-Id and
	// X-Sluice-Request-Id, endVals those of a whole body's Content-Length
	// and Server-Timing (relayBody), tried the backends already tried
	// (forward), usageVal what usage points to (setUsage).
	hsink    httpSink // the sink of ServeHTTP
	ids      [2]string
	endVals  [2]string
	tried    [4]*routing.Backend
	usageVal limiter.Usage

	tenant   *Tenant
	dialect  dialect // the API the path speaks (openai routes): see dialect.go
	route    *routing.Route
	policy   *RoutePolicy // the path's route's until intake matches the model, then route's
	body     []byte
	bodyLen  int   // len(body) once a stream on a loop let go of it (shed)
	bodyMem  int64 // capacity reserved from h.bodies for body
	meta     requestMeta
	alias    *alias // the route serves meta.Model under another name; see alias.go
	ticket   *limiter.Ticket
	decision limiter.Decision
	backend  *routing.Backend

	// Marks on the request's timeline (monotonic clock); see timing.go.
	// admitted is when the request left the pool's admission queue (or
	// went straight through it).
	start, authDone, bodyRead, routed, limited, admitted, picked, upstreamHeaders, firstToken, lastToken time.Time
	// firstSent is when the first token's first write to the client
	// returned (a stream of events only): firstToken → firstSent is the
	// "hold" of the final timing, what Sluice added to the first token
	// after reading it (head, hand-off, the write).
	firstSent time.Time
	// queueWait is the time spent in the edge admission queue: the
	// "queue" stage.
	queueWait time.Duration
	// conn describes the client's connection; rtt is its RTT estimate,
	// read once (rttRead) when first needed.
	conn    listen.ConnInfo
	rtt     time.Duration
	rttRead bool
	// itl holds inter-token gaps in microseconds; lastTokenAt is the
	// previous token's arrival.
	itl         *[]uint32
	lastTokenAt time.Time

	leg     leg   // storage for an unhedged attempt
	hedging *race // the latest hedged race, drained before return
	hedged  bool  // a hedge was sent

	trace *reqTrace // the request's spans; nil when tracing is off (trace.go)
	// tp holds the first attempt's traceparent header values (trace.go,
	// injectSpan): written once, as the exchange is never reused.
	tp tracing.Traceparent
	// timing is the Server-Timing header's value as last made
	// (serverTiming), which the trace's sluice.server_timing reuses.
	timing string

	loop *loopStream // set when an event loop relays the stream (handoff.go)

	status      int   // sent to the client; 0 until headers are written
	tokens      int64 // chunks carrying generated text
	usage       *limiter.Usage
	retries     int
	clientGone  bool
	bytesToUser int64
	trailer     http.Header // for End: set when a stream finished

	// parsed is set when intake read the body as an OpenAI-style request
	// (meta holds its fields).
	parsed bool
	// prefillOnAccept is set when the tenant's charge_prefill is
	// "accepted": prefills counts the attempts, other than the relayed
	// one, whose backend accepted the request (leg.accepted; hedged legs
	// run on their own goroutines), and winnerAccepted says whether the
	// relayed one was accepted, judged when it closes (the transport may
	// mark a body sent only after the answer's head has arrived).
	prefillOnAccept bool
	prefills        atomic.Int32
	winnerAccepted  bool
}

func (x *exchange) serve() error {
	r := x.r
	if err := checkPath(r.URL); err != nil {
		return err // before any route sees the path (all protocols and the bridge)
	}
	if err := x.st.checkAuthority(r); err != nil {
		return err // 421: Host not allowed by the connection's SNI (route.go)
	}
	// The key may come from the query only on routes that allow it, so
	// find the path's route first (without the model) to learn that.
	pre, _ := x.st.Routes.Match(r.Host, r.URL.Path, "")
	x.policy = x.st.policy(pre)
	if pre == nil || x.policy.Kind == KindOpenAI {
		x.dialect = dialectOf(r.URL.Path)
	}
	allowQuery := pre != nil && x.policy.AllowQueryKey
	key := apiKey(r, allowQuery)
	if key == "" && pre != nil && x.policy.Kind == KindWebSocket {
		key, _ = WebSocketKey(r) // browsers send it as a subprotocol
	}
	x.tenant = x.st.Tenants.Lookup(key)
	x.authDone = time.Now()
	if x.tenant == nil {
		return &APIError{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key",
			Message: "missing or unknown API key (send Authorization: Bearer <key>, or x-api-key: <key>)"}
	}
	if r.URL.Path == "/v1/usage" && r.Method == http.MethodGet {
		return x.serveUsage()
	}
	if pre == nil {
		return &APIError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "unknown_url",
			Message: "unknown path " + strconv.Quote(r.URL.Path)}
	}
	if x.policy.Kind == KindWebSocket {
		return x.passthrough(pre)
	}
	if x.policy.Kind == KindOpenAI && r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/models") {
		if models := x.st.Routes.Models(r.Host); len(models) > 0 {
			x.answer(http.StatusOK, modelsBody(models))
			return nil
		}
	}
	if err := x.intake(pre); err != nil {
		return err
	}
	if err := x.admit(); err != nil {
		return err
	}
	return x.forward()
}

// intake reads the body and matches the route with the request's model.
func (x *exchange) intake(pre *routing.Route) error {
	r := x.r
	if r.Body != nil && r.Body != http.NoBody {
		sending := x.h.sending.counter(x.tenant.ID)
		if sending.Add(1) > int64(x.st.Config.TenantBodiesInFlight) {
			sending.Add(-1)
			return errTenantBodies
		}
		// The body's time limits count from authDone: nothing that waits
		// came between, and a clock read is ≈ 0.1 µs on a VM (leg9).
		body, reserved, err := readBody(x.responseWriter(), r, x.st.Config.bodyLimits(), &x.h.bodies, x.authDone)
		sending.Add(-1)
		x.bodyMem = reserved
		if err != nil {
			return err
		}
		x.body = body
	}
	x.bodyRead = time.Now()
	x.route = pre
	if x.policy.Kind != KindOpenAI || r.Method != http.MethodPost {
		x.routed = x.bodyRead
		return nil
	}
	meta, body, err := x.parseRequest(x.body)
	if err != nil {
		return err
	}
	x.meta, x.body, x.parsed = meta, body, true
	// The body was read as JSON whatever the client declared: the backend
	// is told so too (a form or vnd type could be read otherwise there).
	r.Header["Content-Type"] = jsonContentType
	route, err := x.st.Routes.Match(r.Host, r.URL.Path, meta.Model)
	if err != nil {
		return &APIError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found",
			Message: "the model " + strconv.Quote(meta.Model) + " does not exist or is not served here"}
	}
	x.route, x.policy = route, x.st.policy(route)
	x.applyAlias(route) // the route's served name in the body; see alias.go
	x.routed = time.Now()
	return nil
}

// admit asks the limiter whether the request may start. The limiter's
// idempotency id is Sluice's own request id (ownID), never the client's (a
// reused client id must not buy free retries).
func (x *exchange) admit() error {
	defer func() { x.limited = time.Now(); x.admitted = x.limited }()
	lim := x.st.Limiter
	if lim == nil {
		return nil
	}
	limits := x.tenant.Limits
	enforced := x.policy.LimitsEnforced()
	if !enforced {
		if err := x.policy.shadowAllowed(x.tenant, x.meta.Model); err != nil {
			return err // 403 unless the route opts in (route.go)
		}
		limits = shadowed(limits)
	}
	eff, _ := limits.Effective(x.meta.Model)
	x.prefillOnAccept = eff.ChargePrefill != limiter.PrefillFirstToken
	if enforced && eff.Enforced() {
		if err := x.maxTokensCeiling(eff); err != nil {
			return err
		}
	}
	req := limiter.Request{
		ID: x.ownID, Tenant: x.tenant.ID, Model: x.meta.Model, Limits: limits,
		InputTokens: x.meta.InputTokens, OutputTokens: x.meta.OutputTokens, N: x.meta.N,
	}
	if o := limiter.Oversize(req); o != nil {
		if enforced && eff.Enforced() {
			return tooLargeForLimit(o)
		}
		x.sink.Header().Set("X-Sluice-Would-Refuse", "request_too_large_for_limit")
	}
	d, err := lim.Admit(x.r.Context(), req)
	if err != nil {
		if x.r.Context().Err() != nil {
			return context.Canceled
		}
		return &APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "limiter_unavailable",
			Message: "the rate limiter could not decide; retry", RetryAfter: 1}
	}
	limiter.SetHeaders(x.sink.Header(), d)
	if x.dialect == dialectMessages {
		setAnthropicHeaders(x.sink.Header(), d, time.Now())
	}
	if d.WouldRefuse {
		x.sink.Header().Set("X-Sluice-Would-Refuse", d.Reason)
	}
	x.decision = d
	if !d.Allowed {
		return &refusal{d: d}
	}
	x.ticket = d.Ticket
	return nil
}

// fail answers err unless the response has already started.
func (x *exchange) fail(err error) {
	x.err = err
	if x.status != 0 {
		return
	}
	// A body read past its deadline cancels an HTTP/1.1 request's
	// context (net/http cancels it on any connection read error): the
	// client is still there to be told 408.
	if cause := context.Cause(x.r.Context()); cause != nil && err != errBodySlow {
		err = cause
		x.err = err
	}
	if st := x.serverTiming(); st != "" {
		x.sink.Header().Set("Server-Timing", st)
	}
	if rf, ok := err.(*refusal); ok {
		x.status = rf.write(x.sink, x.refusalBody(rf.d))
		return
	}
	ae := ErrorOf(err)
	x.status = ae.Status
	sendErrorBody(x.sink, ae, x.errorBody(ae))
}

// finish settles the request's tokens, writes the access log and reports
// the outcome, with the timing object when timing is set.
func (x *exchange) finish(timing bool) Outcome {
	if x.ticket != nil {
		x.settle()
	}
	o := x.outcome(timing)
	if x.trace != nil {
		x.endTrace(time.Now()) // a clock read only when traced
	}
	x.h.observe(x)
	x.releaseITL()
	return o
}

// settleWait is how long the end of a response waits for its settle. A
// healthy store settles well within it, so the slot is free before the
// client sees the end (a client's next request is never refused by its own
// previous one); a stalled store does not hold the response open: the
// settle goes on in the background, bounded by its own timeout.
const settleWait = 20 * time.Millisecond

// settle settles the ticket, waiting for it up to settleWait, on the
// handler's settle queue (no goroutine, channel or timer per request; a
// local ticket settles at once). Settle runs even when the client is gone;
// the state it uses stays acquired until it has run (SettleDone), and
// Handler.WaitSettles waits for it.
func (x *exchange) settle() {
	x.live.refs.Add(1)
	x.h.settling.Add(1)
	x.h.settles.Settle(x.st.Limiter, x.ticket, x.consumed(), settleWait, x)
}

// SettleDone implements limiter.SettleDone: it runs once the settle has,
// possibly after the handler returned (it reads only fields set before).
func (x *exchange) SettleDone(err error) {
	if err != nil {
		x.h.log.Warn("settle failed", "request_id", x.id, "tenant", x.tenant.ID, "err", err)
	}
	x.live.release()
	x.h.settling.Done()
}

// WaitSettles waits for the settles still running after their responses
// ended (each is bounded by 1s). Call it after the listeners have shut
// down and before the limiter stops.
func (h *Handler) WaitSettles() { h.settling.Wait() }

// outcome is what the exchange reports to Serve's caller.
func (x *exchange) outcome(timing bool) Outcome {
	o := Outcome{RequestID: x.id, Status: x.status, Err: x.err, Usage: x.usage}
	if x.err != nil {
		var rf *refusal // declared here: errors.As moves it to the heap
		if errors.As(x.err, &rf) {
			o.RetryAfter = rf.d.RetryAfter
		}
	}
	if timing {
		o.Timing = timingJSON(x, time.Now())
	}
	return o
}

// consumed is what the request actually used: the backend's usage report
// when it sent one; else the prompt estimate plus the tokens relayed; and,
// under charge_prefill "accepted", the prompt estimate once for every
// other attempt a backend accepted (cancelled or timed out during the
// prefill, retried, or a hedge that lost). Under "first_token" an attempt
// that produced nothing is refunded in full.
func (x *exchange) consumed() limiter.Usage {
	var u limiter.Usage
	charged := true
	switch {
	case x.usage != nil:
		u = *x.usage
	case !x.firstToken.IsZero():
		u = limiter.Usage{InputTokens: x.meta.InputTokens, OutputTokens: x.tokens}
	default:
		charged = false
	}
	if x.prefillOnAccept {
		n := int64(x.prefills.Load()) // the other attempts a backend accepted
		if !charged && x.winnerAccepted {
			n++ // the relayed one, when nothing else charged its prompt
		}
		u.InputTokens += n * x.meta.InputTokens
	}
	return u
}

// RequestID returns in (a client's X-Request-Id) when it is a strict
// token: 1 to 64 characters from A-Z a-z 0-9 "-" "_" "." ":"; else a new
// random id. The strict set keeps a client's id from forging log fields or
// smuggling separators into backends' logs; Sluice's own id always goes
// beside it as X-Sluice-Request-Id.
func RequestID(in string) string {
	if n := len(in); n > 0 && n <= 64 {
		ok := true
		for i := 0; i < n; i++ {
			c := in[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':') {
				ok = false
				break
			}
		}
		if ok {
			return in
		}
	}
	return newID()
}

// clientIP is the address of the connection's peer.
func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// refusal is a limiter refusal (429, or 503 when the store failed closed).
type refusal struct{ d limiter.Decision }

func (r *refusal) Error() string { return "refused by limit " + r.d.Reason }

func (r *refusal) write(s Sink, body []byte) int {
	status := limiter.StatusCode(r.d)
	s.Header().Set("Content-Type", "application/json")
	s.Error(status, body)
	return status
}

// usageReporter is the part of a limiter that reports a tenant's use.
type usageReporter interface {
	Snapshot(ctx context.Context, tenant string, l limiter.Limits) (limiter.Status, error)
}

// serveUsage answers GET /v1/usage: the tenant's limits, current use and
// what remains.
func (x *exchange) serveUsage() error {
	ur, ok := x.st.Limiter.(usageReporter)
	if !ok {
		return &APIError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "unknown_url",
			Message: "usage is not available: no limiter is configured"}
	}
	st, err := ur.Snapshot(x.r.Context(), x.tenant.ID, x.tenant.Limits)
	if err != nil {
		return &APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "limiter_unavailable",
			Message: "usage could not be read; retry", RetryAfter: 1}
	}
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	x.answer(http.StatusOK, append(b, '\n'))
	return nil
}
