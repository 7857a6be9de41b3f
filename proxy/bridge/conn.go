package bridge

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"golang.org/x/time/rate"

	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/proxy/listen"
	"github.com/sluice-proxy/sluice/proxy/observe"
	"github.com/sluice-proxy/sluice/proxy/ws"
)

// serve checks and upgrades a request for the bridge endpoint, then
// serves the socket until it closes. Refusals are answered before the
// upgrade: 426 without an upgrade, 403 for a foreign origin, 401 for a
// missing or unknown key.
func (b *Bridge) serve(w http.ResponseWriter, r *http.Request, st *proxy.State) {
	cfg := st.Config.WebSocket
	w.Header().Set("X-Request-Id", proxy.RequestID(r.Header.Get("X-Request-Id")))
	if region := b.h.Region(); region != "" {
		w.Header().Set("X-Sluice-Region", region)
	}
	if !websocket.IsWebSocketUpgrade(r) || r.Method != http.MethodGet {
		w.Header().Set("Upgrade", "websocket")
		proxy.WriteError(w, &proxy.APIError{Status: http.StatusUpgradeRequired, Type: "invalid_request_error", Code: "upgrade_required",
			Message: "this endpoint speaks WebSocket: send GET with Upgrade: websocket"})
		return
	}
	if err := ws.CheckOrigin(r, cfg.AllowedOrigins); err != nil {
		proxy.WriteError(w, proxy.ErrorOf(err))
		return
	}
	if err := st.CheckAuthority(r); err != nil {
		proxy.WriteError(w, proxy.ErrorOf(err))
		return
	}
	key, fromProtocol := proxy.WebSocketKey(r)
	tenant := st.Tenants.Lookup(key)
	if tenant == nil {
		proxy.WriteError(w, &proxy.APIError{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key",
			Message: "missing or unknown API key (send Authorization: Bearer <key>, or the subprotocols sluice.v1, sluice.key.<key>)"})
		return
	}
	release, err := b.h.OpenWebSocket(r, tenant.ID, cfg)
	if err != nil {
		proxy.WriteError(w, proxy.ErrorOf(err))
		return
	}
	defer release()
	hdr := http.Header{"X-Request-Id": w.Header()["X-Request-Id"], "X-Sluice-Region": w.Header()["X-Sluice-Region"]}
	conn, err := ws.NewUpgrader([]string{ws.SubprotocolV1}, proxy.WriteHandshakeError).Upgrade(w, r, hdr)
	if err != nil {
		return // the upgrader has answered
	}
	c := newWSConn(b, cfg, conn, r, key, fromProtocol)
	b.metrics.WSOpen(observe.WSModeBridge, 1)
	defer b.metrics.WSOpen(observe.WSModeBridge, -1)
	start := time.Now()
	code := c.serve()
	b.log.Info("websocket closed", "mode", observe.WSModeBridge, "tenant", tenant.ID, "remote", clientIP(r),
		"duration", time.Since(start), "requests", c.served.Load(), "close_code", code)
}

// wsConn is one bridged socket. The upgrade handler's goroutine reads
// client frames and starts one goroutine per request; one writer goroutine
// owns every write to the socket (gorilla allows one writer at a time).
type wsConn struct {
	b    *Bridge
	cfg  ws.Config
	conn *websocket.Conn
	up   *http.Request
	hdr  http.Header // template for each request's headers
	// connInfo is the socket's connection for its requests: protocol
	// Proto, no handshake (the socket paid it once).
	connInfo listen.ConnInfo
	ctx      context.Context
	stop     context.CancelCauseFunc

	out        chan *[]byte  // the bounded send queue
	quit       chan struct{} // closed by serve: the writer stops
	writerGone chan struct{} // closed when the writer has stopped
	emptied    chan struct{} // a request ended and none is left (cap 1)
	queued     atomic.Int64  // bytes queued for the client
	lastActive atomic.Int64  // unix nanoseconds of the last client frame or request end
	closeCode  atomic.Int32  // the close code sent or received
	served     atomic.Int64

	// starts limits the request frames the socket may start per second.
	starts *rate.Limiter

	mu       sync.Mutex
	reqs     map[string]*wsRequest // running requests by id
	running  int                   // requests whose terminal frame is not queued yet
	draining bool                  // the server drains: no new requests
	closing  bool                  // the socket is closing: no new requests
	wg       sync.WaitGroup
}

// wsRequest is one request running on a bridged socket.
type wsRequest struct {
	c         *wsConn
	id        string
	prefix    []byte // chunk frame prefix
	ctx       context.Context
	cancel    context.CancelFunc
	cancelled atomic.Bool // by a cancel frame
	slow      *time.Timer // the slow-client deadline, reused for every wait
}

// slowTimer returns the request's stopped slow-client timer.
func (rq *wsRequest) slowTimer() *time.Timer {
	if rq.slow == nil {
		rq.slow = time.NewTimer(time.Hour)
		rq.slow.Stop()
	}
	return rq.slow
}

func newWSConn(b *Bridge, cfg ws.Config, conn *websocket.Conn, r *http.Request, key string, fromProtocol bool) *wsConn {
	c := &wsConn{
		b: b, cfg: cfg, conn: conn, up: r, hdr: bridgeHeader(r.Header, key, fromProtocol),
		out: make(chan *[]byte, cfg.SendQueue), quit: make(chan struct{}), writerGone: make(chan struct{}),
		emptied: make(chan struct{}, 1), reqs: map[string]*wsRequest{},
		starts: rate.NewLimiter(rate.Limit(cfg.RequestRate), cfg.RequestBurst),
	}
	c.ctx, c.stop = context.WithCancelCause(r.Context())
	c.connInfo, _ = listen.ConnInfoFrom(r.Context())
	c.connInfo.Proto, c.connInfo.Handshake = Proto, 0
	c.lastActive.Store(time.Now().UnixNano())
	return c
}

// bridgeHeader is the header template of the socket's requests: the
// upgrade's headers without the handshake's own fields, with the key as
// Authorization (it may have come in a subprotocol) and a fresh request id
// per request.
func bridgeHeader(in http.Header, key string, fromProtocol bool) http.Header {
	h := in.Clone()
	for _, k := range []string{"Sec-Websocket-Key", "Sec-Websocket-Version", "Sec-Websocket-Extensions",
		"Sec-Websocket-Protocol", "Origin", "X-Request-Id", "Content-Length", "Upgrade", "Connection"} {
		h.Del(k)
	}
	if fromProtocol {
		h.Del("X-Api-Key")
		h.Set("Authorization", "Bearer "+key)
	}
	h.Set("Content-Type", "application/json")
	return h
}

// serve runs the socket until it closes and returns the close code.
func (c *wsConn) serve() int {
	c.conn.SetReadLimit(int64(c.cfg.MaxMessageBytes))
	c.conn.SetPongHandler(func(string) error { return c.extendRead() })
	go c.writeLoop()
	err := c.readLoop()
	if ce, ok := err.(*websocket.CloseError); ok && c.closeCode.Load() == 0 {
		c.closeCode.Store(int32(ce.Code))
	}
	if err == websocket.ErrReadLimit {
		c.closeCode.CompareAndSwap(0, websocket.CloseMessageTooBig)
		ws.Linger(c.conn) // gorilla has sent 1009; let it arrive
	}
	// The socket is done: cancel what runs, stop the writer, wait.
	c.stop(context.Canceled)
	c.conn.Close()
	close(c.quit)
	c.wg.Wait()
	<-c.writerGone
	return int(c.closeCode.Load())
}

func (c *wsConn) extendRead() error {
	return c.conn.SetReadDeadline(time.Now().Add(c.cfg.Liveness()))
}

// readLoop reads client frames until the socket fails or closes.
func (c *wsConn) readLoop() error {
	for {
		c.extendRead()
		mt, msg, err := c.conn.ReadMessage()
		if err != nil {
			return err
		}
		c.lastActive.Store(time.Now().UnixNano())
		if mt != websocket.TextMessage {
			c.reply("", badFrame("binary frames are not supported; send JSON text frames"))
			continue
		}
		c.handle(msg)
	}
}

// handle acts on one client frame.
func (c *wsConn) handle(msg []byte) {
	f, perr := parseClientFrame(msg, c.cfg.Path)
	if perr != nil {
		c.reply(f.ID, perr)
		return
	}
	if f.Type == frameCancel {
		c.mu.Lock()
		rq := c.reqs[f.ID]
		c.mu.Unlock()
		if rq != nil {
			rq.cancelled.Store(true)
			rq.cancel()
		}
		return // a cancel for an unknown or finished id is ignored
	}
	rq, refuse := c.register(f.ID)
	if refuse != nil {
		c.reply(f.ID, refuse)
		return
	}
	go c.run(rq, f)
}

// register reserves a request slot for id.
func (c *wsConn) register(id string) (*wsRequest, *proxy.APIError) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.draining || drainBegun(c.up.Context()):
		// The writer learns of the drain on its own goroutine; a frame
		// read meanwhile is refused all the same.
		return nil, proxy.ErrorOf(listen.ErrDraining)
	case c.closing:
		return nil, &proxy.APIError{Status: http.StatusServiceUnavailable, Type: "invalid_request_error", Code: "socket_closing",
			Message: "the socket is closing (idle timeout); open a new one", RetryAfter: 1}
	case c.reqs[id] != nil:
		return nil, badFrame("a request with this id is already running; this frame was ignored")
	case c.running >= c.cfg.MaxInflight:
		return nil, &proxy.APIError{Status: http.StatusTooManyRequests, Type: "invalid_request_error", Code: "too_many_inflight",
			Message: "too many requests in flight on this socket; wait for one to finish", RetryAfter: 1}
	case c.starts != nil && !c.starts.Allow():
		return nil, &proxy.APIError{Status: http.StatusTooManyRequests, Type: "invalid_request_error", Code: "socket_request_rate",
			Message: "request frames arrive on this socket faster than its request_rate allows; slow down", RetryAfter: 1}
	}
	rq := &wsRequest{c: c, id: id, prefix: chunkPrefix(id)}
	rq.ctx, rq.cancel = context.WithCancel(c.ctx)
	c.reqs[id] = rq
	c.running++
	c.wg.Add(1)
	return rq, nil
}

// run serves one request frame through the pipeline and queues its
// terminal frame.
func (c *wsConn) run(rq *wsRequest, f clientFrame) {
	defer c.wg.Done()
	defer c.release(rq)
	defer rq.cancel()
	c.served.Add(1)
	s := &bridgeSink{rq: rq, hdr: http.Header{}}
	o := c.b.h.Serve(c.request(rq.ctx, f), s, c.connInfo)
	if s.status == http.StatusOK && !s.stream && o.Err == nil && len(s.body) > 0 {
		b := getFrame()
		*b = appendChunk(*b, rq.prefix, "", s.body)
		if c.enqueue(context.Background(), b, nil) != nil {
			return
		}
	}
	b := getFrame()
	*b = append(*b, s.terminal(&o)...)
	c.forget(rq) // the id may be reused as soon as the client reads this
	c.enqueue(context.Background(), b, nil)
}

// request builds the pipeline request for a frame: the upgrade's headers,
// host, peer and TLS state, the frame's path and body.
func (c *wsConn) request(ctx context.Context, f clientFrame) *http.Request {
	r := (&http.Request{
		Method: f.Method, URL: f.url, Proto: "websocket", ProtoMajor: 1, ProtoMinor: 1,
		Header: c.hdr.Clone(), Host: c.up.Host, RemoteAddr: c.up.RemoteAddr, TLS: c.up.TLS,
		RequestURI: f.Path, Body: http.NoBody,
	}).WithContext(ctx)
	if f.Method == http.MethodPost {
		r.Body = io.NopCloser(bytes.NewReader(f.Body))
		r.ContentLength = int64(len(f.Body))
	}
	return r
}

// forget frees a request's id.
func (c *wsConn) forget(rq *wsRequest) {
	c.mu.Lock()
	if c.reqs[rq.id] == rq {
		delete(c.reqs, rq.id)
	}
	c.mu.Unlock()
}

// release frees a request's slot once its terminal frame is queued.
func (c *wsConn) release(rq *wsRequest) {
	c.forget(rq)
	c.lastActive.Store(time.Now().UnixNano())
	c.mu.Lock()
	c.running--
	empty := c.running == 0
	c.mu.Unlock()
	if empty {
		select {
		case c.emptied <- struct{}{}:
		default:
		}
	}
}

// reply queues an error frame about a client frame.
func (c *wsConn) reply(id string, e *proxy.APIError) {
	b := getFrame()
	*b = append(*b, newErrorFrame(id, "", e)...)
	c.enqueue(context.Background(), b, nil)
}

// enqueue puts a frame in the send queue. A chunk waits at most until
// deadline fires (the request's slow-client timer); other frames (deadline
// nil) wait until the socket is gone. The frame is recycled when it cannot
// be queued.
func (c *wsConn) enqueue(ctx context.Context, f *[]byte, deadline *time.Timer) error {
	n := int64(len(*f))
	c.b.queued(c.queued.Add(n))
	select {
	case c.out <- f:
		return nil
	default:
	}
	var timeout <-chan time.Time
	if deadline != nil {
		deadline.Reset(c.cfg.SlowClientDeadline)
		defer deadline.Stop()
		timeout = deadline.C
	}
	var err error
	select {
	case c.out <- f:
		return nil
	case <-timeout:
		err = errSlowClient
		c.b.metrics.WSSlowClient()
	case <-ctx.Done():
		err = context.Cause(ctx)
	case <-c.writerGone:
		err = errConnGone
	}
	c.queued.Add(-n)
	putFrame(f)
	return err
}

// writeLoop owns the socket's writes: queued frames, pings, and the close
// frame. It also closes the socket when it has been idle too long and, once
// the server drains, when no request is left.
func (c *wsConn) writeLoop() {
	defer close(c.writerGone)
	ping := time.NewTicker(c.cfg.PingInterval)
	defer ping.Stop()
	idle := time.NewTimer(c.cfg.IdleTimeout)
	defer idle.Stop()
	drain := listen.DrainSignal(c.up.Context())
	stopped := c.up.Context().Done() // the server is stopping now
	for {
		select {
		case f := <-c.out:
			if !c.write(f) {
				return
			}
		case <-ping.C:
			if err := c.conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(c.cfg.Liveness())); err != nil {
				c.conn.Close()
				return
			}
		case <-idle.C:
			if d := c.idleFor(); d > 0 {
				idle.Reset(d)
				continue
			}
			c.close(websocket.CloseNormalClosure, "idle timeout")
			return
		case <-drain:
			drain = nil
			if c.beginDrain() {
				c.close(websocket.CloseGoingAway, "server shutting down")
				return
			}
		case <-stopped: // past the drain timeout: running requests are ending
			stopped, drain = nil, nil
			if c.beginDrain() {
				c.close(websocket.CloseGoingAway, "server shutting down")
				return
			}
		case <-c.emptied:
			if c.drained() {
				c.close(websocket.CloseGoingAway, "server shutting down")
				return
			}
		case <-c.quit:
			return
		}
	}
}

// write sends one queued frame; false means the socket failed.
func (c *wsConn) write(f *[]byte) bool {
	c.conn.SetWriteDeadline(time.Now().Add(c.cfg.Liveness()))
	err := c.conn.WriteMessage(websocket.TextMessage, *f)
	c.queued.Add(-int64(len(*f)))
	putFrame(f)
	if err != nil {
		c.conn.Close() // the reader fails and serve tears down
		return false
	}
	return true
}

// idleFor returns how long until the socket counts as idle, or 0 if it is;
// an idle socket takes no new request (it is about to close).
func (c *wsConn) idleFor() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running > 0 {
		return c.cfg.IdleTimeout
	}
	left := c.cfg.IdleTimeout - time.Since(time.Unix(0, c.lastActive.Load()))
	if left > 0 {
		return left
	}
	c.closing = true
	return 0
}

// beginDrain refuses new requests from now on; it reports whether none is
// running (so the socket can close at once).
func (c *wsConn) beginDrain() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.draining = true
	return c.running == 0
}

// drained reports whether the socket drains and no request is left.
func (c *wsConn) drained() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.draining && c.running == 0
}

// close writes what is queued, then the close frame, and gives the client
// ws.CloseGrace to answer before the socket is closed under the reader.
func (c *wsConn) close(code int, text string) {
	for {
		select {
		case f := <-c.out:
			if !c.write(f) {
				return
			}
			continue
		default:
		}
		break
	}
	c.closeCode.Store(int32(code))
	c.conn.WriteControl(websocket.CloseMessage, ws.CloseMessage(code, text), time.Now().Add(ws.CloseGrace))
	time.AfterFunc(ws.CloseGrace, func() { c.conn.Close() })
}

// clientIP is the address of the connection's peer.
func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// drainBegun reports whether the server serving ctx has begun to drain.
func drainBegun(ctx context.Context) bool {
	select {
	case <-listen.DrainSignal(ctx):
		return true
	default:
		return false
	}
}
