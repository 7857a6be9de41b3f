package listen

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Connection bounds of the TCP listeners (HTTP/1.1, h2c, TLS and h2):
// a client address may hold at most MaxConnsPerAddr connections, and a
// connection that has not started a request within FirstRequestTimeout is
// closed. Go's http.Server closes an idle h2 connection only after
// IdleTimeout (2m), also before its first request; h1 has
// ReadHeaderTimeout. This bound makes both ~10s, however the client
// trickles its bytes (the timer is not reset by traffic, only by a
// request reaching the handler). Once a connection has served a request,
// IdleTimeout applies between requests.
const (
	DefaultMaxConnsPerAddr     = 1024
	DefaultFirstRequestTimeout = 10 * time.Second
	DefaultIdleTimeout         = 2 * time.Minute
)

// capListener refuses connections past the per-address cap (closing them
// at once) and arms each accepted connection's first-request timer.
type capListener struct {
	net.Listener
	max   int
	first time.Duration
	mu    sync.Mutex
	conns map[string]int // client IP -> open connections
	// exempt are the trusted proxies, whose connections are not counted.
	exempt []netip.Prefix
	// re takes re-admitted connections (cleartext HTTP only; else nil).
	re *readmitListener
}

func newCapListener(ln net.Listener, max int, first time.Duration) *capListener {
	if max <= 0 {
		max = DefaultMaxConnsPerAddr
	}
	if first <= 0 {
		first = DefaultFirstRequestTimeout
	}
	return &capListener{Listener: ln, max: max, first: first, conns: map[string]int{}}
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if ap, ok := addrPort(c.RemoteAddr()); ok && inPrefixes(l.exempt, ap.Addr()) {
			// A trusted L7 proxy carries many clients (counted by the
			// address it names, per request, where caps apply per IP).
			cc := &capConn{Conn: c, l: l}
			cc.timer = newFirstTimer(cc, l.firstLeft(c))
			return cc, nil
		}
		ip := addrIP(c.RemoteAddr())
		l.mu.Lock()
		if l.conns[ip] >= l.max {
			l.mu.Unlock()
			c.Close() // over the cap: refused before any byte is read
			continue
		}
		l.conns[ip]++
		l.mu.Unlock()
		cc := &capConn{Conn: c, l: l, ip: ip}
		cc.counted.Store(true)
		cc.timer = newFirstTimer(cc, l.firstLeft(c))
		return cc, nil
	}
}

// newFirstTimer closes cc's socket unless a request started on it within
// d (the server then closes cc).
func newFirstTimer(cc *capConn, d time.Duration) *time.Timer {
	c := cc.Conn
	return time.AfterFunc(d, func() {
		if cc.served.CompareAndSwap(false, true) {
			c.Close()
		}
	})
}

// firstLeft is the time c has left to start its first request: the whole
// first-request timeout, less the time a PROXY listener took to read its
// header (both count from the TCP accept).
func (l *capListener) firstLeft(c net.Conn) time.Duration {
	if pc, ok := c.(*proxyConn); ok {
		return max(l.first-time.Since(pc.accepted), time.Millisecond)
	}
	return l.first
}

// addrIP is the key a client address is counted under: its IP, or for
// IPv6 its /64 prefix (one subscriber's usual allocation, so a client
// cannot pass the caps by rotating addresses within it).
func addrIP(a net.Addr) string {
	var ip net.IP
	switch ta := a.(type) {
	case *net.TCPAddr:
		ip = ta.IP
	case *net.UDPAddr:
		ip = ta.IP
	default:
		return ClientKey(a.String())
	}
	return ipKey(ip)
}

// ClientKey is the key under which the caps count the client at addr
// ("host:port" or a bare host): the IP, or for IPv6 its /64 prefix.
func ClientKey(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if ip := net.ParseIP(host); ip != nil {
		return ipKey(ip)
	}
	return host
}

func ipKey(ip net.IP) string {
	if v4 := ip.To4(); v4 != nil {
		return v4.String()
	}
	return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// capConn is one accepted connection, counted against its address until
// closed.
type capConn struct {
	net.Conn
	l      *capListener
	ip     string
	timer  *time.Timer
	served atomic.Bool // a request started (or the timer fired)
	closed atomic.Bool
	// counted is set while the connection is in l.conns; kept makes Close
	// leave it there (KeepCounted: the socket lives on elsewhere).
	counted, kept atomic.Bool
	// retired: the socket went on under another capConn (ReadmitConn);
	// Close leaves it alone.
	retired atomic.Bool
	// re is the listener that re-admitted the connection (Readmit); nil
	// for one accepted from the socket.
	re *readmitListener
}

// request marks that a request started on the connection: the
// first-request timer no longer applies.
func (c *capConn) request() {
	if !c.served.Load() && c.served.CompareAndSwap(false, true) {
		c.timer.Stop()
		if c.re != nil {
			c.re.served(c)
		}
	}
}

func (c *capConn) Close() error {
	if c.retired.Load() {
		return nil
	}
	if c.closed.CompareAndSwap(false, true) {
		c.timer.Stop()
		if c.re != nil {
			c.re.served(c)
		}
		if !c.kept.Load() {
			c.uncount()
		}
	}
	return c.Conn.Close()
}

// uncount takes the connection out of its address's count, once (a trusted
// proxy's is not counted).
func (c *capConn) uncount() {
	if !c.counted.CompareAndSwap(true, false) {
		return
	}
	c.l.mu.Lock()
	if c.l.conns[c.ip]--; c.l.conns[c.ip] <= 0 {
		delete(c.l.conns, c.ip)
	}
	c.l.mu.Unlock()
}

// KeepCounted keeps c (a connection a listener of this package accepted,
// hijacked from its server) counted against its client address after c is
// closed, until the returned release is called: for a socket that lives on
// outside c (the event loops dup it, then close c). Without it a client
// could hold more connections than its cap by streaming. release is
// idempotent; for a connection not counted it does nothing.
func KeepCounted(c net.Conn) (release func()) {
	cc := capConnOf(c)
	if cc == nil {
		return func() {}
	}
	cc.kept.Store(true)
	// A Close before this line has uncounted c already: release is then a
	// no-op (counted is false).
	return cc.uncount
}

// capConnOf finds the capConn under c (cleartext, or under TLS).
func capConnOf(c net.Conn) *capConn {
	if tc, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = tc.NetConn()
	}
	if hc, ok := c.(*handshakenConn); ok {
		c = hc.Conn
	}
	cc, _ := c.(*capConn)
	return cc
}

// SyscallConn exposes the socket (for TCP_INFO RTT readings).
func (c *capConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, syscall.EINVAL
}
