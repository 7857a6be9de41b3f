package listen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"time"
)

// PROXY protocol (HAProxy's, versions 1 and 2, as specified in
// haproxy.org/download/2.x/doc/proxy-protocol.txt): an L4 load balancer
// sends a header with the client's address before the connection's own
// bytes (HTTP or TLS). A listener with ProxyProtocol on:
//
//   - accepts connections only from AllowedCIDRs (the load balancers); a
//     connection from any other address is closed at once, before any of
//     its bytes is read, whether or not it would send a header. Serving
//     such clients with their own address would mean reading their first
//     bytes to tell a header from HTTP or TLS before they are counted
//     against any cap (the per-address cap must count the address the
//     header names, so it applies after the header), and a PROXY listener
//     reachable without its load balancer is a misconfiguration better
//     seen at once. HAProxy's accept-proxy and nginx's proxy_protocol also
//     require the header of every connection.
//   - reads the header, v1 or v2, within the header timeout (the
//     first-request timeout); a missing, malformed or late header closes
//     the connection.
//   - hands the connection on with RemoteAddr (and LocalAddr) those the
//     header names, so the per-address caps, the access log and every
//     per-IP decision see the client. A v2 LOCAL header (the balancer's
//     own health checks), v1 UNKNOWN, or a v2 family other than AF_INET or
//     AF_INET6 keep the connection's own addresses, as the spec asks.
//
// The RTT read from TCP_INFO stays that of the balancer's connection to
// Sluice: the client's own round trip ends at the balancer.

// ProxyProtocol configures the PROXY protocol on one TCP listener.
type ProxyProtocol struct {
	// Enabled requires a PROXY protocol header (v1 or v2) on every
	// connection of the listener.
	Enabled bool `yaml:"enabled"`
	// AllowedCIDRs are the addresses allowed to connect (the load
	// balancers); connections from elsewhere are closed unread.
	AllowedCIDRs []string `yaml:"allowed_cidrs"`
}

// Prefixes parses AllowedCIDRs (a bare address counts as a single host).
func (p ProxyProtocol) Prefixes() ([]netip.Prefix, error) { return ParsePrefixes(p.AllowedCIDRs) }

// ParsePrefixes parses CIDRs such as "10.0.0.0/8" or "fd00::/8"; a bare
// address is a single host.
func ParsePrefixes(cidrs []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(cidrs))
	for _, s := range cidrs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("%q is not a CIDR (such as 10.0.0.0/8) or an IP address", s)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// inPrefixes reports whether ip (an IPv4-mapped IPv6 address counts as
// IPv4) is in one of ps.
func inPrefixes(ps []netip.Prefix, ip netip.Addr) bool {
	ip = ip.Unmap()
	for _, p := range ps {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

const (
	// maxV1Header is the longest v1 header, CRLF included (spec 2.1).
	maxV1Header = 107
	v2HeaderLen = 16
)

var (
	v1Sig = []byte("PROXY ")
	v2Sig = []byte("\r\n\r\n\x00\r\nQUIT\n")

	errNoHeader = errors.New("no PROXY protocol header")
)

// proxyHeader is a parsed header: the client's (src) and the balancer's
// listening (dst) addresses, or nil ones when the header says to keep the
// connection's own (v1 UNKNOWN, v2 LOCAL, v2 AF_UNSPEC or AF_UNIX).
type proxyHeader struct {
	version  int
	src, dst *net.TCPAddr
}

// readProxyHeader reads one PROXY protocol header, v1 or v2, from br and
// nothing after it. It never reads a byte before deciding the bytes so far
// can still start a header, so a stream without one fails with
// errNoHeader after as few bytes as tell.
func readProxyHeader(br *bufio.Reader) (proxyHeader, error) {
	v1, v2 := true, true
	for i := 0; i < len(v2Sig) && (v1 || v2); i++ {
		b, err := br.Peek(i + 1)
		if err != nil {
			return proxyHeader{}, fmt.Errorf("reading PROXY header: %w", err)
		}
		v1 = v1 && b[i] == v1Sig[i]
		v2 = v2 && b[i] == v2Sig[i]
		if v1 && i == len(v1Sig)-1 {
			return readV1(br)
		}
	}
	if v2 {
		return readV2(br)
	}
	return proxyHeader{}, errNoHeader
}

// readV1 reads a v1 header: "PROXY TCP4|TCP6 src dst sport dport\r\n" or
// "PROXY UNKNOWN ...\r\n", at most 107 bytes.
func readV1(br *bufio.Reader) (proxyHeader, error) {
	var line []byte
	for n := len(v1Sig) + 1; ; n++ {
		b, err := br.Peek(n)
		if err != nil {
			return proxyHeader{}, fmt.Errorf("reading PROXY v1 header: %w", err)
		}
		if b[n-1] == '\n' {
			line = b
			break
		}
		if n >= maxV1Header {
			return proxyHeader{}, errors.New("PROXY v1 header longer than 107 bytes")
		}
	}
	h, err := parseV1(line)
	if err != nil {
		return proxyHeader{}, err
	}
	br.Discard(len(line))
	return h, nil
}

func parseV1(line []byte) (proxyHeader, error) {
	h := proxyHeader{version: 1}
	body, ok := bytes.CutSuffix(line, []byte("\r\n"))
	if !ok {
		return h, errors.New("PROXY v1 header does not end in CRLF")
	}
	f := bytes.Split(body[len(v1Sig):], []byte(" "))
	switch string(f[0]) {
	case "UNKNOWN":
		return h, nil // the rest, if any, is ignored (spec 2.1)
	case "TCP4", "TCP6":
	default:
		return h, fmt.Errorf("PROXY v1 protocol %q is not TCP4, TCP6 or UNKNOWN", f[0])
	}
	if len(f) != 5 {
		return h, errors.New("PROXY v1 header needs source and destination addresses and ports")
	}
	v4 := string(f[0]) == "TCP4"
	src, err1 := v1Addr(f[1], f[3], v4)
	dst, err2 := v1Addr(f[2], f[4], v4)
	if err := errors.Join(err1, err2); err != nil {
		return h, err
	}
	h.src, h.dst = src, dst
	return h, nil
}

func v1Addr(ip, port []byte, v4 bool) (*net.TCPAddr, error) {
	a, err := netip.ParseAddr(string(ip))
	if err != nil || a.Zone() != "" || a.Is4() != v4 {
		return nil, fmt.Errorf("PROXY v1 address %q is not an IPv%s address", ip, map[bool]string{true: "4", false: "6"}[v4])
	}
	if len(port) == 0 || len(port) > 1 && port[0] == '0' {
		return nil, fmt.Errorf("PROXY v1 port %q is malformed", port)
	}
	p, err := strconv.ParseUint(string(port), 10, 16)
	if err != nil {
		return nil, fmt.Errorf("PROXY v1 port %q is malformed", port)
	}
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(a, uint16(p))), nil
}

// readV2 reads a v2 header: the 12-byte signature, version and command,
// family and transport, the length of what follows, the addresses and
// TLVs (skipped).
func readV2(br *bufio.Reader) (proxyHeader, error) {
	h := proxyHeader{version: 2}
	b, err := br.Peek(v2HeaderLen)
	if err != nil {
		return h, fmt.Errorf("reading PROXY v2 header: %w", err)
	}
	verCmd, fam := b[12], b[13]
	n := int(binary.BigEndian.Uint16(b[14:16]))
	if verCmd>>4 != 2 {
		return h, fmt.Errorf("PROXY v2 header version %d is not 2", verCmd>>4)
	}
	cmd := verCmd & 0xF
	if cmd > 1 {
		return h, fmt.Errorf("PROXY v2 command %d is neither LOCAL nor PROXY", cmd)
	}
	var need int
	switch fam >> 4 {
	case 0: // AF_UNSPEC
	case 1:
		need = 12
	case 2:
		need = 36
	case 3:
		need = 216
	default:
		return h, fmt.Errorf("PROXY v2 address family %d is unknown", fam>>4)
	}
	if n < need {
		return h, fmt.Errorf("PROXY v2 length %d is shorter than the addresses (%d)", n, need)
	}
	br.Discard(v2HeaderLen)
	var addrs [36]byte
	keep := min(need, len(addrs))
	if _, err := io.ReadFull(br, addrs[:keep]); err != nil {
		return h, fmt.Errorf("reading PROXY v2 addresses: %w", err)
	}
	if _, err := br.Discard(n - keep); err != nil { // TLVs (and AF_UNIX paths): skipped
		return h, fmt.Errorf("reading PROXY v2 TLVs: %w", err)
	}
	if cmd == 0 || fam&0xF != 1 || need == 0 || need == 216 {
		// LOCAL, a transport other than STREAM, AF_UNSPEC or AF_UNIX:
		// the connection's own addresses stand (spec 2.2).
		return h, nil
	}
	if need == 12 {
		h.src = v2Addr(netip.AddrFrom4([4]byte(addrs[0:4])), addrs[8:10])
		h.dst = v2Addr(netip.AddrFrom4([4]byte(addrs[4:8])), addrs[10:12])
	} else {
		h.src = v2Addr(netip.AddrFrom16([16]byte(addrs[0:16])), addrs[32:34])
		h.dst = v2Addr(netip.AddrFrom16([16]byte(addrs[16:32])), addrs[34:36])
	}
	return h, nil
}

func v2Addr(ip netip.Addr, port []byte) *net.TCPAddr {
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(ip, binary.BigEndian.Uint16(port)))
}

// proxyConn is a connection whose header has been read: its addresses are
// the header's, and the bytes read past the header come first.
type proxyConn struct {
	net.Conn
	pending       []byte
	remote, local net.Addr
	accepted      time.Time // the TCP accept
}

func (c *proxyConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

func (c *proxyConn) RemoteAddr() net.Addr { return c.remote }
func (c *proxyConn) LocalAddr() net.Addr  { return c.local }

// SyscallConn exposes the balancer's socket (TCP_INFO RTT readings are
// those of the balancer's connection).
func (c *proxyConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, syscall.EINVAL
}

// proxyListener accepts connections from the allowed sources and reads
// each one's PROXY header in its own goroutine (a slow balancer connection
// holds up no other), handing on those whose header is complete.
type proxyListener struct {
	prepListener
	allowed []netip.Prefix
	timeout time.Duration
	log     *slog.Logger
}

func newProxyListener(inner net.Listener, allowed []netip.Prefix, timeout time.Duration, log *slog.Logger) *proxyListener {
	l := &proxyListener{allowed: allowed, timeout: timeout, log: log}
	l.admit, l.prepare = l.fromAllowed, l.readHeader
	l.start(inner)
	return l
}

// fromAllowed reports whether c comes from an allowed source.
func (l *proxyListener) fromAllowed(c net.Conn) bool {
	if ap, ok := addrPort(c.RemoteAddr()); ok && inPrefixes(l.allowed, ap.Addr()) {
		return true
	}
	l.log.Debug("PROXY protocol listener: connection from a source outside allowed_cidrs refused",
		"remote", c.RemoteAddr().String())
	return false
}

// readHeader reads c's header within the timeout: the connection to hand
// on, or nil when it was refused (c is closed).
func (l *proxyListener) readHeader(c net.Conn, accepted time.Time) net.Conn {
	stop := context.AfterFunc(l.ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	c.SetDeadline(accepted.Add(l.timeout))
	br := bufio.NewReaderSize(c, 256)
	h, err := readProxyHeader(br)
	if err != nil || !stop() {
		if err != nil && l.ctx.Err() == nil {
			l.log.Debug("PROXY protocol header refused", "remote", c.RemoteAddr().String(), "err", err)
		}
		c.Close()
		return nil
	}
	c.SetDeadline(time.Time{})
	pc := &proxyConn{Conn: c, remote: c.RemoteAddr(), local: c.LocalAddr(), accepted: accepted}
	if h.src != nil {
		pc.remote, pc.local = h.src, h.dst
	}
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		pc.pending = bytes.Clone(b)
	}
	return pc
}

func addrPort(a net.Addr) (netip.AddrPort, bool) {
	switch ta := a.(type) {
	case *net.TCPAddr:
		return ta.AddrPort(), true
	case *net.UDPAddr:
		return ta.AddrPort(), true
	}
	ap, err := netip.ParseAddrPort(a.String())
	return ap, err == nil
}
