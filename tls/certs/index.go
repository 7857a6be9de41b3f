package certs

import (
	"crypto/tls"
	"net"
	"net/netip"
	"strings"
)

// index is an immutable lookup table over the current certificates. It is
// replaced as a whole on reload, never changed in place.
type index struct {
	certs    []*tls.Certificate // config order; certs[0] is the default
	exact    map[string][]*tls.Certificate
	wildcard map[string][]*tls.Certificate // key: the part after "*."
	ips      map[netip.Addr][]*tls.Certificate
}

func newIndex(certs []*tls.Certificate) *index {
	ix := &index{
		certs:    certs,
		exact:    make(map[string][]*tls.Certificate),
		wildcard: make(map[string][]*tls.Certificate),
		ips:      make(map[netip.Addr][]*tls.Certificate),
	}
	for _, c := range certs {
		for _, n := range c.Leaf.DNSNames {
			n = normalizeName(n)
			if suffix, ok := strings.CutPrefix(n, "*."); ok {
				ix.wildcard[suffix] = appendOnce(ix.wildcard[suffix], c)
			} else if n != "" {
				ix.exact[n] = appendOnce(ix.exact[n], c)
			}
		}
		for _, ip := range c.Leaf.IPAddresses {
			if a, ok := netip.AddrFromSlice(ip); ok {
				a = a.Unmap()
				ix.ips[a] = appendOnce(ix.ips[a], c)
			}
		}
	}
	return ix
}

func appendOnce(list []*tls.Certificate, c *tls.Certificate) []*tls.Certificate {
	for _, x := range list {
		if x == c {
			return list
		}
	}
	return append(list, c)
}

// lookup picks the certificate for hello: exact SNI name, then a wildcard
// for the first label (or, for an IP literal in SNI, an IP SAN); without
// SNI, an IP SAN of the address the client dialled; else the first pair.
func (ix *index) lookup(hello *tls.ClientHelloInfo) *tls.Certificate {
	name := normalizeName(hello.ServerName)
	if name != "" {
		if c := ix.byName(hello, name); c != nil {
			return c
		}
	} else if a, ok := localAddr(hello); ok {
		if c := ix.pick(hello, ix.ips[a]); c != nil {
			return c
		}
	}
	if len(ix.certs) == 0 {
		return nil
	}
	return ix.certs[0]
}

func (ix *index) byName(hello *tls.ClientHelloInfo, name string) *tls.Certificate {
	if mayBeIP(name) {
		if a, err := netip.ParseAddr(name); err == nil {
			return ix.pick(hello, ix.ips[a.Unmap()])
		}
	}
	if c := ix.pick(hello, ix.exact[name]); c != nil {
		return c
	}
	if _, suffix, ok := strings.Cut(name, "."); ok {
		return ix.pick(hello, ix.wildcard[suffix])
	}
	return nil
}

// pick returns the first candidate the client supports (key type, signature
// algorithms), else the first candidate, else nil.
func (ix *index) pick(hello *tls.ClientHelloInfo, cands []*tls.Certificate) *tls.Certificate {
	for _, c := range cands {
		if len(cands) == 1 || hello.SupportsCertificate(c) == nil {
			return c
		}
	}
	if len(cands) > 0 {
		return cands[0]
	}
	return nil
}

func localAddr(hello *tls.ClientHelloInfo) (netip.Addr, bool) {
	if hello.Conn == nil || hello.Conn.LocalAddr() == nil {
		return netip.Addr{}, false
	}
	var ip net.IP
	switch a := hello.Conn.LocalAddr().(type) {
	case *net.TCPAddr:
		ip = a.IP
	case *net.UDPAddr:
		ip = a.IP
	default:
		ap, err := netip.ParseAddrPort(a.String())
		if err != nil {
			return netip.Addr{}, false
		}
		return ap.Addr().Unmap(), true
	}
	addr, ok := netip.AddrFromSlice(ip)
	return addr.Unmap(), ok
}

// mayBeIP is a cheap test before netip.ParseAddr, whose error allocates:
// IPv6 literals contain a colon and IPv4 literals end in a digit, which DNS
// names rarely do (those that do are parsed, rejected, and looked up as names).
// name is not empty.
func mayBeIP(name string) bool {
	last := name[len(name)-1]
	return strings.IndexByte(name, ':') >= 0 || ('0' <= last && last <= '9')
}

// normalizeName lower-cases a DNS name and drops a trailing dot.
func normalizeName(n string) string {
	return strings.TrimSuffix(strings.ToLower(n), ".")
}
