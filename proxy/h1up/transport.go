// Package h1up is Sluice's own HTTP/1.1 client for plaintext (http://)
// upstreams. Unlike net/http's Transport it keeps no goroutine per
// connection: RoundTrip writes the request and reads the response head on
// the caller's goroutine, the response body is read on the reader's, and
// context cancellation closes the connection through context.AfterFunc
// (or, on a ConnCanceler, the context closes it itself).
// That lets the proxy take an upstream connection over once a stream is
// committed (Body.Detach) and hand it to an event loop, which net/http's
// readLoop/writeLoop pair never allows.
//
// A body read to its end returns its connection to a per-host idle pool
// (LIFO, bounded, with an idle timeout and a liveness check on reuse).
// TLS, HTTP/2 and protocol upgrades are not spoken: the proxy keeps
// net/http for those.
package h1up

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-proxy/sluice/proxy/internal/rawsock"
)

// Options configure a Transport. The zero value is usable: every field has
// a default.
type Options struct {
	// Dial opens a connection to addr ("host:port"). If nil, a net.Dialer
	// with Timeout DialTimeout and 30s TCP keep-alive is used.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// DialTimeout bounds the default dialer's connect. Zero means no bound
	// beyond the request's context.
	DialTimeout time.Duration
	// IdleConnTimeout closes a connection that stayed idle in the pool this
	// long. Zero means 90s.
	IdleConnTimeout time.Duration
	// MaxIdleConnsPerHost bounds the idle pool of each host; the oldest
	// idle connection is closed to make room. Zero means 1024.
	MaxIdleConnsPerHost int
	// ReadBufferSize is the size of the pooled buffered reader a
	// connection holds while a response is read. Zero means 4 KiB.
	ReadBufferSize int
	// SpareOnDetach dials a replacement in the background each time a
	// body detaches its connection (Body.Detach: the connection leaves
	// the client for good) and parks it idle, so the next request to that
	// host finds a connection instead of dialing on its own time. At most
	// maxSpareDials such dials run at once. False (the default) dials
	// nothing ahead.
	SpareOnDetach bool
	// ProbeAfter is how long a connection may sit idle before its reuse
	// pays the liveness check (one recv(MSG_PEEK)): one returned to the
	// pool more recently is reused unchecked. A reused connection that
	// then fails before any response byte makes every idle connection to
	// its host checked again for ProbeAfter (the backend may be closing
	// them all: a shutdown), and the request is retried only under
	// RoundTrip's rule, as when the check passed and the backend hung up
	// just after. Zero checks every reuse; negative means zero. When zero,
	// the environment's SLUICE_H1UP_PROBE_AFTER (a duration) sets it.
	ProbeAfter time.Duration
}

// maxSpareDials bounds a Transport's replacement dials in flight
// (Options.SpareOnDetach).
const maxSpareDials = 16

// Errors callers may branch on.
var (
	// ErrScheme is returned for a URL whose scheme is not http.
	ErrScheme = errors.New("h1up: only http:// URLs are supported")
	// ErrMalformedResponse wraps a response head the client refuses:
	// unparseable, or with framing that could smuggle a second response
	// (Content-Length with Transfer-Encoding, differing Content-Lengths,
	// a transfer coding other than chunked).
	ErrMalformedResponse = errors.New("h1up: malformed response")
	// ErrDetached is returned by Read after Detach, and by Detach twice.
	ErrDetached = errors.New("h1up: body detached")
	// ErrBodyClosed is returned by Read after Close.
	ErrBodyClosed = errors.New("h1up: read on closed body")
)

// Transport is an http.RoundTripper for HTTP/1.1 over plaintext TCP. It is
// safe for concurrent use by multiple goroutines.
type Transport struct {
	o       Options
	readers sync.Pool // *bufio.Reader of o.ReadBufferSize
	writers sync.Pool // *bufio.Writer

	mu    sync.Mutex
	idle  map[string][]*conn // per host:port, oldest first (LIFO: take the last)
	sweep *time.Timer        // closes expired idle conns; nil when none is armed
	gen   uint64             // CloseIdleConnections calls: a spare dialed before one is not parked

	spares atomic.Int32 // replacement dials in flight

	// suspect holds, per host, until when every reuse is checked
	// (Options.ProbeAfter): set when a reused connection failed before
	// any response byte or a check found one dead. Nil until then.
	suspect map[string]time.Time
}

// envProbeAfter is SLUICE_H1UP_PROBE_AFTER, read once.
var envProbeAfter = func() time.Duration {
	d, err := time.ParseDuration(os.Getenv("SLUICE_H1UP_PROBE_AFTER"))
	if err != nil {
		return 0
	}
	return d
}()

var _ http.RoundTripper = (*Transport)(nil)

// New returns a Transport with o's settings, defaults filled in.
func New(o Options) *Transport {
	if o.IdleConnTimeout <= 0 {
		o.IdleConnTimeout = 90 * time.Second
	}
	if o.MaxIdleConnsPerHost <= 0 {
		o.MaxIdleConnsPerHost = 1024
	}
	if o.ReadBufferSize <= 0 {
		o.ReadBufferSize = 4 << 10
	}
	if o.ProbeAfter == 0 {
		o.ProbeAfter = envProbeAfter
	}
	if o.Dial == nil {
		d := &net.Dialer{Timeout: o.DialTimeout, KeepAlive: 30 * time.Second}
		o.Dial = d.DialContext
	}
	t := &Transport{o: o, idle: map[string][]*conn{}}
	size := o.ReadBufferSize
	t.readers.New = func() any { return bufio.NewReaderSize(nil, size) }
	t.writers.New = func() any { return bufio.NewWriterSize(nil, 4<<10) }
	return t
}

// conn is one upstream connection. While a request is in flight it holds
// a pooled reader; idle in the pool it holds nothing but the socket.
type conn struct {
	nc     net.Conn
	key    string // host:port it is pooled under
	br     *bufio.Reader
	idleAt time.Time // when it went idle
	reused bool      // it served a request before the current one
	probe  *prober   // the liveness check; nil where there is none
	// rs is nc's socket read and written raw (Linux, a *net.TCPConn,
	// SLUICE_RAW_SOCKETS not 0); nil: through nc. Made with probe.
	rs *rawsock.Conn
}

// reader is what the connection's response is read from: its raw socket,
// or nc.
func (c *conn) reader() io.Reader {
	if c.rs != nil {
		return c.rs
	}
	return c.nc
}

// write writes p on the connection: on its raw socket, or through nc.
func (c *conn) write(p []byte) (int, error) {
	if c.rs != nil {
		return c.rs.Write(p)
	}
	return c.nc.Write(p)
}

// RoundTrip sends req on an idle or new connection and reads the response
// head. The returned response's Body is a *Body. A request on a reused
// connection that fails before any response byte is retried once on a new
// connection under net/http's rule: when nothing of it could be written
// and its body can be sent again, or when it is replayable (no body or
// GetBody set) and idempotent (GET, HEAD, OPTIONS, TRACE, or an
// Idempotency-Key header).
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		defer req.Body.Close() // a RoundTripper always closes it: written or failed
	}
	return t.roundTrip(req)
}

func (t *Transport) roundTrip(req *http.Request) (*http.Response, error) {
	if req.URL == nil {
		return nil, errors.New("h1up: nil request URL")
	}
	if req.URL.Scheme != "http" {
		return nil, fmt.Errorf("%w: %q", ErrScheme, req.URL.Scheme)
	}
	if req.URL.Host == "" {
		return nil, errors.New("h1up: request URL has no host")
	}
	ctx := req.Context()
	if ctx.Err() != nil {
		return nil, causeOf(ctx)
	}
	key := hostPort(req.URL.Host, req.URL.Port())
	for retried := false; ; retried = true {
		resp, c, wrote, err := t.exchange(ctx, key, retried, req)
		if err == nil {
			return resp, nil
		}
		if c == nil { // no connection taken: a dial failed or the context ended
			return nil, err
		}
		if c.reused && t.o.ProbeAfter > 0 && ctx.Err() == nil {
			var nr *errNoResponse
			if !wrote || errors.As(err, &nr) {
				t.markSuspect(key)
			}
		}
		if retried || !c.reused || ctx.Err() != nil || !retryable(req, wrote, err) {
			return nil, err
		}
		if req.GetBody != nil && req.Body != nil && req.Body != http.NoBody {
			body, gerr := req.GetBody()
			if gerr != nil {
				return nil, err
			}
			defer body.Close()
			r2 := *req // a shallow copy: the caller's request stays as given
			r2.Body = body
			req = &r2
		}
	}
}

// hostPort is the pool key and dial address of a URL host: port 80 when
// the URL names none.
func hostPort(host, port string) string {
	if port != "" {
		return host
	}
	if len(host) > 0 && host[0] == '[' { // [v6]
		return host + ":80"
	}
	return net.JoinHostPort(host, "80")
}

// errNoResponse marks a connection that failed before any byte of the
// response arrived: a candidate for a retry on a fresh connection.
type errNoResponse struct{ err error }

func (e *errNoResponse) Error() string { return "h1up: no response: " + e.err.Error() }
func (e *errNoResponse) Unwrap() error { return e.err }

// retryable applies net/http's retry rule to a request that failed on a
// reused connection.
func retryable(req *http.Request, wrote bool, err error) bool {
	hasBody := req.Body != nil && req.Body != http.NoBody
	if !wrote {
		return !hasBody || req.GetBody != nil
	}
	var nr *errNoResponse
	if !errors.As(err, &nr) || (hasBody && req.GetBody == nil) {
		return false
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, a := req.Header["Idempotency-Key"]
	_, b := req.Header["X-Idempotency-Key"]
	return a || b
}

// exchange writes req on a connection to key (a new one when fresh is
// set) and reads the response head. The connection is taken when the
// request's writer first sends bytes (reqWriter); c is nil when none was
// (a failed dial). wrote reports that the request write succeeded (a retry
// may duplicate it). On error c is closed.
func (t *Transport) exchange(ctx context.Context, key string, fresh bool, req *http.Request) (resp *http.Response, c *conn, wrote bool, err error) {
	b := &Body{t: t, ctx: ctx}
	b.cc, _ = ctx.(ConnCanceler)
	b.w = reqWriter{t: t, b: b, key: key, fresh: fresh}
	fail := func(err error) (*http.Response, *conn, bool, error) {
		c := b.c
		b.abort()
		if ctx.Err() != nil {
			err = causeOf(ctx)
		}
		return nil, c, wrote, err
	}
	if err := t.writeRequest(&b.w, req); err != nil {
		if b.c == nil && b.w.err != nil {
			err = b.w.err // getConn's own error, unwrapped
		}
		return fail(err)
	}
	wrote = true
	c = b.c
	if w, ok := ctx.(Waiter); ok {
		w.Waiting()
	}
	c.br = t.readers.Get().(*bufio.Reader)
	c.br.Reset(c.reader())
	resp, err = readResponse(c, req, b)
	if err != nil {
		return fail(err)
	}
	resp.Body = b
	switch {
	case b.mode == modeNone:
		b.finish() // no body: the connection is free now
	case c.br.Buffered() == 0: // nothing of the body yet: hold no reader while waiting
		c.br.Reset(nil)
		t.readers.Put(c.br)
		c.br = nil
	}
	return resp, c, true, nil
}

// reqWriter is what a request's pooled bufio.Writer writes to. It takes
// the request's connection when the writer first sends bytes. A request
// that fits the writer's buffer whole is sent by its last flush (last set),
// where on Linux sendWait checks a reused connection's liveness, writes
// the request and waits for the answer in one RawConn.Read: three system
// calls for a small request on a kept connection (peek, write, the
// answer's read) instead of four (the peek, the write, a read meeting
// EAGAIN, the answer's read). A request that does not fit takes its
// connection (liveness-checked as getConn does) at its first flush and is
// written through the net.Conn, as is every request on a connection
// sendWait does not work on.
type reqWriter struct {
	t     *Transport
	b     *Body
	key   string
	fresh bool
	last  bool  // the flush now is the request's last
	err   error // getConn's error
}

func (w *reqWriter) Write(p []byte) (int, error) {
	if c := w.b.c; c != nil {
		return c.write(p)
	}
	for {
		single := w.last && sendWaitOn // the whole request is in p, for sendWait
		c, err := w.t.getConn(w.b.ctx, w.key, w.fresh, !single)
		if err != nil {
			w.err = err
			return 0, err
		}
		w.b.attach(c)
		n, dead := 0, false
		switch {
		case single && c.canSendWait():
			n, dead, err = c.sendWait(p)
		case single && c.reused:
			dead = !c.alive() // getConn left the check to this write
		}
		if dead {
			if !w.drop() {
				return 0, causeOf(w.b.ctx)
			}
			continue
		}
		if err != nil || n == len(p) {
			return n, err
		}
		m, err := c.write(p[n:]) // all of p, or what EAGAIN or a partial write left
		return n + m, err
	}
}

// drop closes the dead connection the request was about to go on, before
// anything was written on it, and reports whether another may be taken
// (false: the request's context is done).
func (w *reqWriter) drop() bool {
	b, c := w.b, w.b.c
	b.c = nil
	stopped := b.unwatch()
	c.nc.Close()
	if w.t.o.ProbeAfter > 0 {
		w.t.markSuspect(w.key)
	}
	return stopped && b.ctx.Err() == nil
}

// getConn takes the newest live idle connection to key, or dials one;
// with fresh set it always dials. Without check, an idle connection is
// returned unchecked: its caller checks it (reqWriter).
func (t *Transport) getConn(ctx context.Context, key string, fresh, check bool) (*conn, error) {
	now := time.Now()
	t.mu.Lock()
	for !fresh {
		s := t.idle[key]
		if len(s) == 0 {
			break
		}
		c := s[len(s)-1]
		s[len(s)-1] = nil
		t.idle[key] = s[:len(s)-1]
		idle := now.Sub(c.idleAt)
		if idle >= t.o.IdleConnTimeout {
			t.closeAllLocked(key) // the rest are older still
			c.nc.Close()
			break
		}
		if !check || idle < t.o.ProbeAfter && (t.suspect == nil || !now.Before(t.suspect[key])) {
			t.mu.Unlock()
			c.reused = true
			return c, nil
		}
		t.mu.Unlock()
		if c.alive() {
			c.reused = true
			return c, nil
		}
		c.nc.Close()
		if t.o.ProbeAfter > 0 {
			t.markSuspect(key)
		}
		t.mu.Lock()
	}
	t.mu.Unlock()
	nc, err := t.o.Dial(ctx, "tcp", key)
	if err != nil {
		if ctx.Err() != nil {
			return nil, causeOf(ctx)
		}
		return nil, err
	}
	c := &conn{nc: nc, key: key}
	c.initProbe()
	return c, nil
}

// markSuspect makes every reuse of an idle connection to key pay the
// liveness check for the next ProbeAfter (Options.ProbeAfter).
func (t *Transport) markSuspect(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.suspect == nil {
		t.suspect = map[string]time.Time{}
	}
	t.suspect[key] = time.Now().Add(t.o.ProbeAfter)
}

// spare dials a connection to key in the background and parks it idle
// (Options.SpareOnDetach). A dial that fails is dropped; one that ends
// after CloseIdleConnections is closed. The goroutine ends with its dial.
func (t *Transport) spare(key string) {
	if t.spares.Add(1) > maxSpareDials {
		t.spares.Add(-1)
		return
	}
	t.mu.Lock()
	gen := t.gen
	t.mu.Unlock()
	timeout := t.o.DialTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	go func() {
		defer t.spares.Add(-1)
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		nc, err := t.o.Dial(ctx, "tcp", key)
		if err != nil {
			return
		}
		c := &conn{nc: nc, key: key, idleAt: time.Now()}
		c.initProbe()
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.gen != gen {
			nc.Close()
			return
		}
		t.parkLocked(c)
	}()
}

// putIdle returns c, its response read to the end, to its host's pool.
func (t *Transport) putIdle(c *conn) {
	if c.br != nil {
		c.br.Reset(nil)
		t.readers.Put(c.br)
		c.br = nil
	}
	c.idleAt = time.Now()
	t.mu.Lock()
	t.parkLocked(c)
	t.mu.Unlock()
}

// parkLocked adds the idle c to its host's pool.
func (t *Transport) parkLocked(c *conn) {
	s := t.idle[c.key]
	if len(s) >= t.o.MaxIdleConnsPerHost {
		s[0].nc.Close()
		copy(s, s[1:])
		s = s[:len(s)-1]
	}
	t.idle[c.key] = append(s, c)
	if t.sweep == nil {
		t.sweep = time.AfterFunc(t.o.IdleConnTimeout, t.sweepIdle)
	}
}

// sweepIdle closes the connections idle for longer than IdleConnTimeout
// and re-arms itself for the next one to expire, if any.
func (t *Transport) sweepIdle() {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sweep = nil
	var next time.Duration
	for key, s := range t.idle {
		i := 0
		for i < len(s) && now.Sub(s[i].idleAt) >= t.o.IdleConnTimeout {
			s[i].nc.Close()
			i++
		}
		if i > 0 {
			n := copy(s, s[i:])
			clear(s[n:])
			s = s[:n]
		}
		if len(s) == 0 {
			delete(t.idle, key)
			continue
		}
		t.idle[key] = s
		if d := t.o.IdleConnTimeout - now.Sub(s[0].idleAt); next == 0 || d < next {
			next = d
		}
	}
	if next > 0 {
		t.sweep = time.AfterFunc(next, t.sweepIdle)
	}
}

func (t *Transport) closeAllLocked(key string) {
	for _, c := range t.idle[key] {
		c.nc.Close()
	}
	delete(t.idle, key)
}

// CloseIdleConnections closes every idle connection. Connections in use
// are not touched.
func (t *Transport) CloseIdleConnections() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.gen++
	for key := range t.idle {
		t.closeAllLocked(key)
	}
	if t.sweep != nil {
		t.sweep.Stop()
		t.sweep = nil
	}
}

// IdleConns is the number of idle connections in the pool, all hosts.
func (t *Transport) IdleConns() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, s := range t.idle {
		n += len(s)
	}
	return n
}

// idleCount is the number of idle connections to key (for tests).
func (t *Transport) idleCount(key string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.idle[key])
}
