package bridge

import (
	"errors"
	"log/slog"
	"net/http"
	"sync/atomic"

	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/proxy/observe"
)

// Proto is listen.ConnInfo.Proto (and the proto label of metrics and the
// access log) for requests made over the bridge.
const Proto = "ws"

var (
	errSlowClient = errors.New("client did not read frames in time")
	errConnGone   = errors.New("websocket connection closed")
)

// Options configures a Bridge.
type Options struct {
	// Log receives a line per closed socket. Nil means slog.Default().
	Log *slog.Logger
	// Metrics counts open sockets and slow clients. Nil means none.
	Metrics *observe.Metrics
}

// Bridge is an http.Handler that serves the WebSocket bridge's endpoint
// (the path of the handler's current ws.Config, when the bridge is
// enabled) and passes every other request to the pipeline's handler. It is
// safe for simultaneous use by multiple goroutines.
type Bridge struct {
	h       *proxy.Handler
	log     *slog.Logger
	metrics *observe.Metrics
	// peakQueued is the most bytes any one socket has had queued for its
	// client (frames in the send queue, frames waiting to enter it, and
	// the frame being written).
	peakQueued atomic.Int64
}

var _ http.Handler = (*Bridge)(nil)

// New returns a Bridge in front of h.
func New(h *proxy.Handler, opts Options) *Bridge {
	b := &Bridge{h: h, log: opts.Log, metrics: opts.Metrics}
	if b.log == nil {
		b.log = slog.Default()
	}
	return b
}

// ServeHTTP upgrades and serves a request for the bridge endpoint and
// passes any other request to the handler. The socket uses the state
// current at the upgrade only to upgrade (auth, config); each request on
// it runs through Serve with the state current then, so a long-lived
// socket does not keep a replaced state alive.
func (b *Bridge) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	st := b.h.State()
	if st.Config.WebSocket.IsBridge(r) {
		b.serve(w, r, st)
		return
	}
	b.h.ServeHTTP(w, r)
}

// PeakQueued is the most bytes any one socket of b has had queued for its
// client since b was made: frames in the send queue, frames waiting to
// enter it, and the frame being written.
func (b *Bridge) PeakQueued() int64 { return b.peakQueued.Load() }

// queued records n bytes queued on one socket.
func (b *Bridge) queued(n int64) {
	for {
		p := b.peakQueued.Load()
		if n <= p || b.peakQueued.CompareAndSwap(p, n) {
			return
		}
	}
}
