package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluice-proxy/sluice/routing"
)

// NewTransport returns the transport Sluice uses to reach backends:
// pooled keep-alive connections, no compression (streams are parsed and
// must not be buffered by a gzip layer), bounded dialing. The connection
// buffers are 4 KiB: an HTTP/1.1 upstream connection is held per stream,
// so their size is paid per held stream, and events are far smaller.
func NewTransport(cfg Config) *http.Transport {
	cfg = cfg.WithDefaults()
	d := &net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:               nil,
		DialContext:         d.DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: cfg.DialTimeout,
		DisableCompression:  true,
		ReadBufferSize:      4 << 10,
		WriteBufferSize:     4 << 10,
	}
}

// forward sends the request to a backend of the route's pool, retrying on
// other backends while nothing has been sent to the client, and hedging
// on a second backend when the route asks for it.
func (x *exchange) forward() error {
	defer x.drainRace()
	retries := *x.st.Config.Retries
	if x.policy.Retries != nil {
		retries = *x.policy.Retries
	}
	tried := x.tried[:0] // in the exchange: acquire and race keep no copy past forward
	var lastErr error
	for attempt := 0; attempt <= retries; attempt++ {
		a, err := x.acquire(attempt, tried, true)
		if err != nil {
			if lastErr != nil {
				break
			}
			return err
		}
		tried = append(tried, a.Backend())
		var l *leg
		if x.policy.HedgeAfter > 0 {
			l, tried, err = x.race(a, tried)
		} else {
			l = x.newLeg(a, &x.leg)
			l.ctx.owner = x // open runs on this goroutine
			l.open()
			err = l.err
		}
		if err == nil {
			return x.relay(l)
		}
		if x.r.Context().Err() != nil {
			return err
		}
		lastErr = err
	}
	if us, ok := lastErr.(*upstreamStatus); ok {
		x.passThrough(us.resp, us.body)
	}
	return lastErr
}

// watchdog cancels an attempt whose backend is too slow: first with
// errFirstTokenTimeout, and, once events flow, with errStreamIdle (its
// timer runs leg.watchdogFired).
type watchdog struct {
	t       *time.Timer
	started atomic.Bool
}

// tick restarts the idle timer after an event.
func (w *watchdog) tick(idle time.Duration) {
	w.started.Store(true)
	w.t.Reset(idle)
}

func (w *watchdog) stop() { w.t.Stop() }

// causeOf prefers the reason the attempt's context was cancelled (timeout,
// drain) over the transport's generic error.
func causeOf(ctx *attemptCtx, err error) error {
	if cause := ctx.Cause(); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return err
}

func isEventStream(h http.Header) bool {
	return strings.HasPrefix(h.Get("Content-Type"), "text/event-stream")
}

// upstreamRequest builds the backend request: the backend's base URL plus
// the client's path, the client's headers without hop-by-hop fields and
// credentials, forwarding headers and the request id.
func (x *exchange) upstreamRequest(ctx context.Context, b *routing.Backend) (*http.Request, error) {
	r := x.r
	// What the request points to (its URL, Sluice's five header values,
	// its body) is one allocation, and the request itself a second: the
	// one WithContext makes of a request built on the stack.
	// (http.NewRequestWithContext would allocate the request, a URL
	// parsed from "" and a header map thrown away below.)
	s := &upstreamReq{url: x.backendURL(b)}
	out := http.Request{Method: r.Method, URL: &s.url, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Host: strings.TrimSuffix(s.url.Host, ":")}
	if x.body != nil {
		s.body.set(&out, x.body)
	}
	// Sized for the client's fields and Sluice's five or six, less the fields
	// clients send most that are never copied: many SDK fields need no
	// growth of the map, a few (curl's, Go's) stay in a small map of 8
	// (one allocation, where a hint past 8 makes a table of four).
	// Sluice's five values share one array.
	f := b.LoadHeaderFormat()
	n := len(r.Header) + 5
	if f != "" {
		n++
	}
	for _, k := range [...]string{"Authorization", "Content-Length", "Accept-Encoding", "X-Api-Key"} {
		if _, ok := r.Header[k]; ok {
			n--
		}
	}
	out.Header = make(http.Header, n)
	copyRequestHeader(out.Header, r.Header)
	proto := "http"
	if r.TLS != nil {
		proto = "https"
	}
	own := &s.own
	*own = [5]string{clientIP(r), proto, r.Host, x.id, x.ownID}
	out.Header["X-Forwarded-For"] = own[0:1:1]
	out.Header["X-Forwarded-Proto"] = own[1:2:2]
	out.Header["X-Forwarded-Host"] = own[2:3:3]
	out.Header["X-Request-Id"] = own[3:4:4]
	out.Header["X-Sluice-Request-Id"] = own[4:5:5]
	if f != "" {
		out.Header["Endpoint-Load-Metrics-Format"] = loadFormatValue(f) // ask vLLM for its load report
	}
	if key := x.route.Pool.Config().APIKey; key != "" {
		out.Header.Set("Authorization", "Bearer "+key)
	}
	return out.WithContext(ctx), nil
}

// upstreamReq is what a backend request points to, allocated together.
type upstreamReq struct {
	url  url.URL
	own  [5]string // X-Forwarded-For, -Proto, -Host, X-Request-Id, X-Sluice-Request-Id
	body replayBody
}

// replayBody is a request body read from memory: its rewind for a retry on
// a new connection (GetBody) is a second one on the same bytes. Once sent
// is set (leg.watchSent), reading it to the end marks *sent, for the
// rewound bodies too.
type replayBody struct {
	bytes.Reader // keeps WriteTo: the transport writes the body in one call
	data         []byte
	sent         *atomic.Bool
	flag         atomic.Bool // the first body's sent, shared with the rewound ones
}

func (*replayBody) Close() error { return nil }

func (rb *replayBody) Read(p []byte) (int, error) {
	n, err := rb.Reader.Read(p)
	if err == io.EOF && rb.sent != nil {
		rb.sent.Store(true)
	}
	return n, err
}

func (rb *replayBody) WriteTo(w io.Writer) (int64, error) {
	n, err := rb.Reader.WriteTo(w)
	if err == nil && rb.sent != nil {
		rb.sent.Store(true)
	}
	return n, err
}

// again is the request's GetBody: a new reader of the same bytes.
func (rb *replayBody) again() (io.ReadCloser, error) {
	n := &replayBody{data: rb.data, sent: rb.sent}
	n.Reset(n.data)
	return n, nil
}

// set makes rb, reading data, req's body as http.NewRequest sets a
// *bytes.Reader body: ContentLength, GetBody, and http.NoBody when empty.
func (rb *replayBody) set(req *http.Request, data []byte) {
	req.ContentLength = int64(len(data))
	if len(data) == 0 {
		req.Body = http.NoBody
		req.GetBody = func() (io.ReadCloser, error) { return http.NoBody, nil }
		return
	}
	rb.data = data
	rb.Reset(data)
	req.Body, req.GetBody = rb, rb.again
}

// backendURL is the URL a request goes to on b: the backend's base URL
// plus the client's path and query (without the API key parameter where
// the route accepts one).
func (x *exchange) backendURL(b *routing.Backend) url.URL {
	r := x.r
	u := *b.URL
	u.Path = strings.TrimSuffix(b.URL.Path, "/") + r.URL.Path
	u.RawPath = ""
	u.RawQuery = r.URL.RawQuery
	if x.policy.AllowQueryKey && u.RawQuery != "" {
		q := r.URL.Query()
		q.Del(queryKeyParam)
		u.RawQuery = q.Encode()
	}
	return u
}

// hopHeaders are meaningful for one connection only and never forwarded
// (RFC 9110 §7.6.1), plus headers Sluice owns in each direction.
var hopHeaders = map[string]bool{
	"Connection": true, "Proxy-Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

// clientOwned are request headers the edge sets itself or must not pass
// on: credentials, framing, the forwarding headers Sluice sets, and the
// headers some backends and frameworks trust for the client's address or
// to rewrite the URL or method (X-Original-URL lets an IIS/Symfony backend
// serve another path than the one Sluice routed; True-Client-IP and
// X-Client-IP would let a client claim another address).
var clientOwned = map[string]bool{
	"Authorization": true, "X-Api-Key": true, "Accept-Encoding": true, "Content-Length": true,
	"Host": true, "Forwarded": true, "X-Forwarded-For": true, "X-Forwarded-Proto": true,
	"X-Forwarded-Host": true, "X-Real-Ip": true, "X-Request-Id": true, "Server-Timing": true,
	"Endpoint-Load-Metrics-Format": true, // the edge asks for load reports, per pool
	"X-Forwarded-Port":             true, "X-Forwarded-Prefix": true, "X-Forwarded-Server": true, "X-Forwarded-Scheme": true,
	"X-Forwarded-Ssl": true, "X-Original-Url": true, "X-Rewrite-Url": true, "X-Original-Uri": true,
	"True-Client-Ip": true, "X-Client-Ip": true, "X-Cluster-Client-Ip": true, "Cf-Connecting-Ip": true,
	"Fastly-Client-Ip": true, "X-Original-Forwarded-For": true, "X-Host": true,
	"X-Http-Method-Override": true, "X-Http-Method": true, "X-Method-Override": true,
}

// Shared values of the endpoint-load-metrics-format request header (never
// modified), so that asking for the load report allocates nothing.
var (
	loadFormatText = []string{"TEXT"}
	loadFormatJSON = []string{"JSON"}
)

// jsonContentType is the Content-Type value of a request body read as
// JSON, shared by every request (never modified).
var jsonContentType = []string{"application/json"}

func loadFormatValue(f string) []string {
	if f == "JSON" {
		return loadFormatJSON
	}
	return loadFormatText
}

// backendOwned are response headers Sluice replaces or must not pass on:
// a backend's Alt-Svc would advertise the backend, not the edge; its load
// report is for the edge's picker, not for clients; its rate-limit fields
// would overwrite the tenant's own (Sluice's limits are the ones a client
// must see); its cookies would be set on the edge's origin, shared by
// every tenant.
var backendOwned = map[string]bool{
	"Alt-Svc": true, "Content-Length": true, "X-Request-Id": true, "Server-Timing": true,
	"Endpoint-Load-Metrics": true, "Set-Cookie": true, "Set-Cookie2": true,
	"Ratelimit": true, "Ratelimit-Policy": true, "Ratelimit-Limit": true, "Ratelimit-Remaining": true,
	"Ratelimit-Reset": true, "Retry-After-Ms": true,
}

func copyRequestHeader(dst, src http.Header) { copyHeader(dst, src, clientOwned, "") }

// copyResponseHeader also drops OpenAI-style X-Ratelimit-* fields: the
// tenant's limits are Sluice's, never the backend's.
func copyResponseHeader(dst, src http.Header) { copyHeader(dst, src, backendOwned, "X-Ratelimit-") }

// copyHeader copies src to dst without hop-by-hop fields, the fields in
// owned or starting with ownedPrefix (canonical form; "" for none), Sluice's
// own X-Sluice-* fields and those src's Connection names. The named fields
// are skipped in the copy, not deleted from dst afterwards: dst may hold
// Sluice's own fields of those names already (a response's request ids and
// rate-limit fields), which a backend's Connection header must not remove.
func copyHeader(dst, src http.Header, owned map[string]bool, ownedPrefix string) {
	conn := src["Connection"]
	if !namesFields(conn) {
		conn = nil
	}
	for k, vv := range src {
		if hopHeaders[k] || owned[k] || strings.HasPrefix(k, "X-Sluice-") {
			continue
		}
		if ownedPrefix != "" && strings.HasPrefix(k, ownedPrefix) {
			continue
		}
		if conn != nil && connectionNames(conn, k) {
			continue
		}
		dst[k] = vv
	}
}

// namesFields reports whether Connection values name any field: the usual
// options ("keep-alive", "close") name none that could be copied
// (Keep-Alive is hop-by-hop), so a header of only those costs the copy
// nothing more.
func namesFields(conn []string) bool {
	for _, v := range conn {
		for f := range strings.SplitSeq(v, ",") {
			f = textproto.TrimString(f)
			if f != "" && !strings.EqualFold(f, "keep-alive") && !strings.EqualFold(f, "close") {
				return true
			}
		}
	}
	return false
}

// connectionNames reports whether Connection values name field k (field
// names compare without regard to case).
func connectionNames(conn []string, k string) bool {
	for _, v := range conn {
		for f := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(textproto.TrimString(f), k) {
				return true
			}
		}
	}
	return false
}
