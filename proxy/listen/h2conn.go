package listen

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Sluice's own HTTP/2 server connection (listeners.h2_server: sluice).
//
// Go's server hands every flushed DATA frame from the handler to the
// connection's serve goroutine and from there to a new goroutine that
// writes it: three wake-ups per token. Here a token costs the one wake-up
// of the handler that read it from upstream: the handler frames it into
// the connection's write buffer under the connection's mutex and writes
// the buffer to the socket itself. A writer that finds another's write
// under way leaves its frames in the buffer; the writer under way sends
// them when its own write returns, before it lets go (nothing waits for a
// later event). One reader goroutine per connection (the goroutine
// net/http hands the connection to) reads the client's frames: requests,
// request bodies, window updates, resets, pings, settings.
//
// The h2 code lives in h2conn.go (connection, reader), h2stream.go
// (requests, response writer, request body) and h2write.go (write buffer,
// flow control, header encoding).

// Values of Server.H2Server.
const (
	H2ServerSluice = "sluice" // Sluice's own (h2conn.go), the default
	H2ServerGo     = "go"     // net/http's HTTP/2 server
)

// h2Limits bound what one client connection may ask of the server.
type h2Limits struct {
	// maxStreams is SETTINGS_MAX_CONCURRENT_STREAMS: streams whose
	// handler runs; one more is refused (REFUSED_STREAM).
	maxStreams int
	// maxHeaderList bounds a request's decoded header list (RFC 7541
	// sizes): a larger one is answered 431 without reaching the handler.
	maxHeaderList uint32
	// maxHeaderFrames bounds the frames (HEADERS and CONTINUATION) of one
	// header block, and maxHeaderBlock its encoded bytes: past either, the
	// connection ends (GOAWAY ENHANCE_YOUR_CALM), a CONTINUATION flood.
	maxHeaderFrames int
	maxHeaderBlock  int
	// streamWindow and connWindow are the receive windows for request
	// bodies.
	streamWindow, connWindow int32
	// resets bounds the client's RST_STREAM frames and control the PING
	// and SETTINGS frames per window (rapid reset, ping and settings
	// floods): past either, GOAWAY ENHANCE_YOUR_CALM.
	resets, control int
	rateWindow      time.Duration
	// idle closes a connection without streams this long (GOAWAY first);
	// readHeader bounds the time from a HEADERS frame to the end of its
	// header block.
	idle, readHeader time.Duration
	// writeStall closes a connection whose socket write has not
	// completed for this long (a client that stopped reading).
	writeStall time.Duration
}

func defaultH2Limits(idle time.Duration) h2Limits {
	return h2Limits{
		maxStreams:      250,
		maxHeaderList:   maxHeaderBytes,
		maxHeaderFrames: 64,
		maxHeaderBlock:  2 * maxHeaderBytes,
		streamWindow:    1 << 20,
		connWindow:      1 << 20, // net/http's MaxUploadBufferPerConnection default: at most 1 MiB of request bodies buffered per connection
		resets:          500,
		control:         500,
		rateWindow:      time.Second,
		idle:            idle,
		readHeader:      10 * time.Second,
		writeStall:      30 * time.Second,
	}
}

// h2Server serves the HTTP/2 connections of one http.Server (one
// listener): it is installed as its TLSNextProto "h2" and
// "unencrypted_http2" (h2c with prior knowledge) and as an OnShutdown
// hook (graceful GOAWAY).
type h2Server struct {
	log    *slog.Logger
	limits h2Limits

	mu    sync.Mutex
	conns map[*h2conn]struct{}
	shut  bool
}

func newH2Server(log *slog.Logger, lim h2Limits) *h2Server {
	return &h2Server{log: log, limits: lim, conns: map[*h2conn]struct{}{}}
}

// install makes srv hand its HTTP/2 connections to h.
func (h *h2Server) install(srv *http.Server) {
	srv.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){
		"h2":                h.serveTLS,
		"unencrypted_http2": h.serveCleartext,
	}
	srv.RegisterOnShutdown(h.shutdown)
}

// serveTLS serves an "h2" connection after its handshake.
func (h *h2Server) serveTLS(_ *http.Server, tc *tls.Conn, hh http.Handler) {
	st := tc.ConnectionState()
	h.serve(tc, tc, &st, hh, false)
}

// serveCleartext serves an h2c connection whose preface net/http read.
func (h *h2Server) serveCleartext(_ *http.Server, tc *tls.Conn, hh http.Handler) {
	u, ok := tc.NetConn().(interface{ UnencryptedNetConn() net.Conn })
	if !ok {
		tc.NetConn().Close()
		return
	}
	nc := u.UnencryptedNetConn()
	h.serve(nc, bufio.NewReaderSize(nc, 4<<10), nil, hh, true)
}

// shutdown begins a graceful shutdown of every connection (net/http calls
// it from Shutdown, possibly more than once).
func (h *h2Server) shutdown() {
	h.mu.Lock()
	h.shut = true
	conns := make([]*h2conn, 0, len(h.conns))
	for c := range h.conns {
		conns = append(conns, c)
	}
	h.mu.Unlock()
	for _, c := range conns {
		c.goAway(http2.ErrCodeNo)
	}
}

func (h *h2Server) serve(nc net.Conn, r io.Reader, tlsState *tls.ConnectionState, hh http.Handler, sawPreface bool) {
	base := context.Background()
	if b, ok := hh.(interface{ BaseContext() context.Context }); ok {
		base = b.BaseContext()
	}
	c := newH2Conn(h, nc, r, tlsState, hh, base)
	h.mu.Lock()
	h.conns[c] = struct{}{}
	shut := h.shut
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.conns, c)
		h.mu.Unlock()
	}()
	c.serve(sawPreface, shut)
}

// h2conn is one client connection.
type h2conn struct {
	srv      *h2Server
	lim      *h2Limits
	nc       net.Conn
	tlsState *tls.ConnectionState
	handler  http.Handler
	base     context.Context
	remote   string

	// Reader goroutine's own state.
	r       io.Reader
	fr      *http2.Framer
	dec     *hpack.Decoder
	hb      headerBlock
	maxSeen uint32 // highest stream id the client opened (written under mu)
	resets  rateCount
	control rateCount

	mu       sync.Mutex
	cond     sync.Cond // windows, buffer space, write done, closing
	streams  map[uint32]*h2stream
	w        h2writer
	closed   bool
	closeErr error
	// goingAway: GOAWAY sent; streams past lastID are refused.
	goingAway bool
	lastID    uint32
	// Send side: the client's windows and settings.
	sendConn int64
	initSend int64
	maxFrame int
	// Receive side: the client's credit on the connection, and the bytes
	// the handlers consumed that were not yet given back.
	recvConn    int64
	unackedConn int64
	idleTimer   *time.Timer
	stallTimer  *time.Timer
	stallSeq    uint64 // w.writes at the stall watchdog's last look
	// Streams on the event loops (h2loop.go): those waiting for credit or
	// buffer space, and the writer goroutine that writes what the loops
	// framed (kick wakes it, quit ends it; started by the first).
	blocked  []*h2stream
	writerOn bool
	kick     chan struct{}
	quit     chan struct{}
	raw      syscall.RawConn // the socket, for the loops' inline writes (roomFor); nil when unknown
}

func newH2Conn(h *h2Server, nc net.Conn, r io.Reader, tlsState *tls.ConnectionState, hh http.Handler, base context.Context) *h2conn {
	c := &h2conn{srv: h, lim: &h.limits, nc: nc, tlsState: tlsState, handler: hh, base: base,
		remote: nc.RemoteAddr().String(), streams: map[uint32]*h2stream{},
		sendConn: 65535, initSend: 65535, maxFrame: 16384, recvConn: 65535}
	c.cond.L = &c.mu
	c.kick, c.quit = make(chan struct{}, 1), make(chan struct{})
	c.raw = rawOf(nc)
	c.r = r
	c.fr = http2.NewFramer(io.Discard, r)
	c.fr.SetMaxReadFrameSize(16384)
	c.dec = hpack.NewDecoder(4096, c.hb.emit)
	c.dec.SetMaxStringLength(int(c.lim.maxHeaderList))
	c.hb.c = c
	c.w.init(c)
	return c
}

var (
	errH2ClientGone = errors.New("http2: client connection lost")
	errStreamReset  = errors.New("http2: stream reset by client")
	errConnShutdown = errors.New("http2: connection shut down")
)

// serve reads the client's frames until the connection ends.
func (c *h2conn) serve(sawPreface, shut bool) {
	defer c.close(errH2ClientGone)
	if !sawPreface {
		var p [len(http2.ClientPreface)]byte
		if _, err := io.ReadFull(c.r, p[:]); err != nil || string(p[:]) != http2.ClientPreface {
			return
		}
	}
	c.mu.Lock()
	c.w.fr.WriteSettings(
		http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: uint32(c.lim.maxStreams)},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: uint32(c.lim.streamWindow)},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: c.lim.maxHeaderList},
	)
	c.w.fr.WriteWindowUpdate(0, uint32(c.lim.connWindow-65535))
	c.recvConn = int64(c.lim.connWindow)
	c.idleTimer = time.AfterFunc(cmp.Or(c.lim.idle, DefaultIdleTimeout), c.idleFired)
	c.flushLocked()
	c.mu.Unlock()
	if shut {
		c.goAway(http2.ErrCodeNo)
	}
	first := true
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			if c.readFailed(err) {
				continue
			}
			return
		}
		if first {
			if sf, ok := f.(*http2.SettingsFrame); !ok || sf.IsAck() {
				c.connError(http2.ErrCodeProtocol)
				return
			}
			first = false
		}
		if err := c.onFrame(f); err != nil {
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				c.connError(http2.ErrCode(ce))
			}
			return
		}
	}
}

// readFailed handles an error of ReadFrame: it reports whether reading
// goes on (a stream error resets the stream; the frame was consumed); a
// connection error sends GOAWAY.
func (c *h2conn) readFailed(err error) bool {
	var se http2.StreamError
	if errors.As(err, &se) {
		c.mu.Lock()
		if st := c.streams[se.StreamID]; st != nil {
			c.resetLocked(st, se.Code)
		} else {
			c.w.fr.WriteRSTStream(se.StreamID, se.Code)
		}
		c.flushLocked()
		c.mu.Unlock()
		return true
	}
	var ce http2.ConnectionError
	if errors.As(err, &ce) {
		c.connError(http2.ErrCode(ce))
	}
	return false
}

// onFrame handles one frame from the client; an error ends the
// connection (an http2.ConnectionError with a GOAWAY).
func (c *h2conn) onFrame(f http2.Frame) error {
	if c.hb.open && f.Header().Type != http2.FrameContinuation {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	switch f := f.(type) {
	case *http2.HeadersFrame:
		return c.onHeaders(f)
	case *http2.ContinuationFrame:
		return c.onContinuation(f)
	case *http2.DataFrame:
		return c.onData(f)
	case *http2.WindowUpdateFrame:
		return c.onWindowUpdate(f)
	case *http2.RSTStreamFrame:
		return c.onReset(f)
	case *http2.SettingsFrame:
		return c.onSettings(f)
	case *http2.PingFrame:
		return c.onPing(f)
	case *http2.GoAwayFrame:
		c.mu.Lock()
		if len(c.streams) == 0 {
			c.mu.Unlock()
			return errConnShutdown
		}
		c.mu.Unlock()
	case *http2.PushPromiseFrame:
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	return nil // PRIORITY, unknown types: ignored
}

func (c *h2conn) onSettings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	if c.control.over(c.lim.control, c.lim.rateWindow) {
		return http2.ConnectionError(http2.ErrCodeEnhanceYourCalm)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return err
		}
		switch s.ID {
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - c.initSend
			c.initSend = int64(s.Val)
			for _, st := range c.streams {
				st.sendWin += delta
				if st.sendWin > 1<<31-1 {
					return http2.ConnectionError(http2.ErrCodeFlowControl)
				}
			}
			c.resumeLocked()
		case http2.SettingMaxFrameSize:
			c.maxFrame = int(s.Val)
		case http2.SettingHeaderTableSize:
			c.w.enc.SetMaxDynamicTableSizeLimit(s.Val)
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.w.fr.WriteSettingsAck()
	c.cond.Broadcast()
	c.flushLocked()
	return nil
}

func (c *h2conn) onPing(f *http2.PingFrame) error {
	if f.IsAck() {
		return nil
	}
	if c.control.over(c.lim.control, c.lim.rateWindow) {
		return http2.ConnectionError(http2.ErrCodeEnhanceYourCalm)
	}
	c.mu.Lock()
	c.w.fr.WritePing(true, f.Data)
	c.flushLocked()
	c.mu.Unlock()
	return nil
}

func (c *h2conn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	inc := int64(f.Increment)
	if f.StreamID == 0 {
		c.sendConn += inc
		if c.sendConn > 1<<31-1 {
			return http2.ConnectionError(http2.ErrCodeFlowControl)
		}
	} else if st := c.streams[f.StreamID]; st != nil {
		st.sendWin += inc
		if st.sendWin > 1<<31-1 {
			c.resetLocked(st, http2.ErrCodeFlowControl)
		}
	} else if f.StreamID > c.maxSeen {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	c.cond.Broadcast()
	c.resumeLocked()
	return nil
}

func (c *h2conn) onReset(f *http2.RSTStreamFrame) error {
	if f.StreamID > c.maxSeen {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	if c.resets.over(c.lim.resets, c.lim.rateWindow) {
		return http2.ConnectionError(http2.ErrCodeEnhanceYourCalm)
	}
	c.mu.Lock()
	if st := c.streams[f.StreamID]; st != nil {
		st.peerReset(errStreamReset)
	}
	c.mu.Unlock()
	return nil
}

// connError ends the connection with a GOAWAY carrying code. Every
// stream ends at once; what the client still sends is read and dropped
// for up to a second (1 MiB), so that closing the socket over unread
// bytes does not reset the connection before the client read the GOAWAY.
func (c *h2conn) connError(code http2.ErrCode) {
	c.mu.Lock()
	if !c.closed {
		c.w.fr.WriteGoAway(c.maxSeen, code, nil)
		c.flushLocked()
	}
	c.mu.Unlock()
	c.abort(errH2ClientGone)
	c.nc.SetReadDeadline(time.Now().Add(time.Second))
	io.CopyN(io.Discard, c.r, 1<<20)
}

// goAway starts a graceful close: the client may open no stream past
// the last one it opened; the running ones finish; then the connection
// closes (when the client closes it, or one second later).
func (c *h2conn) goAway(code http2.ErrCode) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.goingAway || c.closed {
		return
	}
	c.goingAway = true
	c.lastID = c.maxSeen
	c.w.fr.WriteGoAway(c.lastID, code, nil)
	c.flushLocked()
	if len(c.streams) == 0 {
		c.closeSoonLocked()
	}
}

// closeSoonLocked ends a connection that sent GOAWAY and has no streams
// left: the reader stops at the client's close or a second later.
func (c *h2conn) closeSoonLocked() {
	c.nc.SetReadDeadline(time.Now().Add(time.Second))
}

// idleFired closes a connection that stayed without streams.
func (c *h2conn) idleFired() {
	c.mu.Lock()
	idle := len(c.streams) == 0 && !c.closed
	c.mu.Unlock()
	if idle {
		c.goAway(http2.ErrCodeNo)
	}
}

// close ends the connection at once: every stream's handler is cancelled
// and its writes fail.
func (c *h2conn) close(err error) {
	c.abort(err)
	c.nc.Close()
}

// abort ends every stream and makes writes fail; the socket stays open.
func (c *h2conn) abort(err error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.closeErr = err
	for _, st := range c.streams {
		st.peerReset(err)
	}
	if c.idleTimer != nil {
		c.idleTimer.Stop()
	}
	if c.stallTimer != nil {
		c.stallTimer.Stop()
	}
	close(c.quit) // the loops' writer
	c.cond.Broadcast()
	c.mu.Unlock()
}

// rateCount counts events in fixed windows.
type rateCount struct {
	start time.Time
	n     int
}

// over counts one event and reports whether more than max fell in the
// current window.
func (r *rateCount) over(max int, window time.Duration) bool {
	now := time.Now()
	if now.Sub(r.start) > window {
		r.start, r.n = now, 0
	}
	r.n++
	return r.n > max
}

// newH2Server makes the HTTP/2 server of one listener.
func (s *Server) newH2Server() *h2Server {
	lim := defaultH2Limits(cmp.Or(s.IdleTimeout, DefaultIdleTimeout))
	if s.h2limits != nil {
		lim = *s.h2limits
	}
	return newH2Server(s.Log, lim)
}
