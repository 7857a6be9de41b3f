package listen

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"
)

// Protocols reported in ConnInfo.Proto.
const (
	ProtoH1 = "h1"
	ProtoH2 = "h2"
	ProtoH3 = "h3"
)

// ConnInfo describes the client connection a request arrived on. Read it
// with ConnInfoFrom.
type ConnInfo struct {
	// Proto is ProtoH1, ProtoH2 (over TLS, or h2c) or ProtoH3.
	Proto string
	// Handshake is how long the connection's TLS (TCP) or QUIC handshake
	// took, measured at the server: from accepting the TCP connection, or
	// from the client's first QUIC packet, until the handshake completed.
	// It is non-zero only for the first request of a connection (later
	// requests paid no handshake) and zero for cleartext connections. With
	// 0-RTT enabled, a resuming QUIC connection is handed over as soon as
	// its early data may be read, so its Handshake ends there.
	Handshake time.Duration
	// RTT returns the transport's current smoothed round-trip estimate:
	// TCP_INFO on Linux (zero elsewhere), the QUIC connection's RTT
	// statistics for HTTP/3. It reads the estimate when called (a TCP
	// connection's at most once per rttMaxAge: later calls get that
	// reading), so call it when the value is needed, not up front. Never
	// nil. On a PROXY protocol listener it is the RTT of the load
	// balancer's connection to Sluice (the socket's), not the client's.
	RTT func() time.Duration
}

// connState is what Sluice knows about one client connection. It is made
// once per connection and found on every request's context.
type connState struct {
	proto     atomic.Uint32 // a proto* index; protoUnknown until known
	handshake time.Duration // zero for cleartext
	claimed   atomic.Bool   // the first request has taken the handshake
	start     time.Time     // QUIC: first packet; unused for TCP
	raw       syscall.RawConn
	quic      *quic.Conn
	rtt       func() time.Duration // bound once to estimateRTT
	cap       *capConn             // TCP: the per-address cap's record
	// handshaken frees the QUIC handshake's place in the listener's
	// bound (idempotent); nil for TCP.
	handshaken func()

	// The last TCP_INFO reading (nanoseconds) and when it was taken (unix
	// nanoseconds; 0 for never).
	tcpRTT, tcpRTTAt atomic.Int64
}

// rttMaxAge is how long a TCP RTT reading is reused: the kernel's estimate
// is smoothed over many round trips, and each reading is a system call.
const rttMaxAge = time.Second

const (
	protoUnknown uint32 = iota
	protoH1
	protoH2
	protoH3
)

var protoNames = [...]string{protoUnknown: "", protoH1: ProtoH1, protoH2: ProtoH2, protoH3: ProtoH3}

// connKey finds a connection's *connState; firstKey marks the context of
// the first request of a connection that had a handshake.
type (
	connKey  struct{}
	firstKey struct{}
)

func newConnState(proto uint32) *connState {
	cs := &connState{}
	cs.proto.Store(proto)
	cs.rtt = cs.estimateRTT
	return cs
}

// estimateRTT reads the transport's RTT estimate.
func (cs *connState) estimateRTT() time.Duration {
	switch {
	case cs.quic != nil:
		return cs.quic.ConnectionStats().SmoothedRTT
	case cs.raw != nil:
		now := time.Now().UnixNano()
		if at := cs.tcpRTTAt.Load(); at != 0 && now-at < int64(rttMaxAge) {
			return time.Duration(cs.tcpRTT.Load())
		}
		d := tcpRTT(cs.raw)
		cs.tcpRTT.Store(int64(d))
		cs.tcpRTTAt.Store(now)
		return d
	}
	return 0
}

// ConnInfoFrom returns the transport facts of the connection a request
// arrived on, given the request's context (or one derived from it). ok is
// false for requests that did not come through a Server's listener.
func ConnInfoFrom(ctx context.Context) (info ConnInfo, ok bool) {
	cs, _ := ctx.Value(connKey{}).(*connState)
	if cs == nil {
		return ConnInfo{RTT: zeroRTT}, false
	}
	info = ConnInfo{Proto: protoNames[cs.proto.Load()], RTT: cs.rtt}
	if ctx.Value(firstKey{}) != nil {
		info.Handshake = cs.handshake
	}
	return info, true
}

func zeroRTT() time.Duration { return 0 }

// withConn puts a connection's state on its context.
func withConn(ctx context.Context, cs *connState) context.Context {
	return context.WithValue(ctx, connKey{}, cs)
}

// ConnContext is http.Server.ConnContext for the TCP listeners: it puts
// the connection's facts on ctx, for ConnInfoFrom. TLS connections arrive
// with their handshake done (see tlsListener) and carry their state;
// cleartext ones learn their protocol from the first request. An
// http.Server of one's own may use it too (the RTT is then read from c).
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(interface{ NetConn() net.Conn }); ok {
		if hc, ok := tc.NetConn().(*handshakenConn); ok {
			hc.cs.cap = capConnOf(c)
			return withConn(ctx, hc.cs)
		}
	}
	cs := newConnState(protoUnknown)
	cs.cap = capConnOf(c)
	if sc, ok := c.(syscall.Conn); ok {
		cs.raw, _ = sc.SyscallConn()
	}
	return withConn(ctx, cs)
}

// noteRequest runs at the start of every request: it records the protocol
// of cleartext connections and marks the first request of a connection
// that had a handshake (the only case that allocates).
func noteRequest(r *http.Request) *http.Request {
	cs, _ := r.Context().Value(connKey{}).(*connState)
	if cs == nil {
		return r
	}
	if cs.cap != nil {
		cs.cap.request()
	}
	if cs.proto.Load() == protoUnknown {
		p := protoH1
		if r.ProtoMajor == 2 {
			p = protoH2
		}
		cs.proto.CompareAndSwap(protoUnknown, p)
	}
	if cs.handshake > 0 && !cs.claimed.Load() && cs.claimed.CompareAndSwap(false, true) {
		return r.WithContext(context.WithValue(r.Context(), firstKey{}, true))
	}
	return r
}
