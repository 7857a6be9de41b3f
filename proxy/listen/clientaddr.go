package listen

import (
	"net/http"
	"net/netip"
	"strings"
)

// Headers a trusted proxy may name the client in (Server.ClientHeader).
const (
	HeaderXForwardedFor = "x-forwarded-for"
	HeaderForwarded     = "forwarded" // RFC 7239, its for= parameters
)

// realClient sets r.RemoteAddr to the client a trusted proxy names, when
// the peer is one of s.TrustedProxies: the rightmost address of the
// configured header that is not itself a trusted proxy (each proxy
// appends the address it received the request from, so the hops right of
// it were added by proxies we trust, and the ones left of it by the client,
// who can write anything there). A hop that is not an address ("unknown",
// an obfuscated RFC 7239 name, garbage) ends the walk: nothing left of it
// is believed, and the last trusted hop right of it stands. Without a
// trusted peer the headers are ignored (forward.go overwrites
// X-Forwarded-For with the peer, as before).
//
// Only one header is read, the one the operator's proxies set: a proxy
// that appends to X-Forwarded-For passes a Forwarded header the client
// wrote through untouched, so reading both would let the client pick.
func (s *Server) realClient(r *http.Request) {
	if len(s.TrustedProxies) == 0 {
		return
	}
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil || !inPrefixes(s.TrustedProxies, peer.Addr()) {
		return
	}
	name, forwarded := "X-Forwarded-For", s.ClientHeader == HeaderForwarded
	if forwarded {
		name = "Forwarded"
	}
	vals := r.Header.Values(name)
	var client netip.Addr
hops:
	for i := len(vals) - 1; i >= 0; i-- {
		v := vals[i]
		for v != "" {
			var hop string
			if j := strings.LastIndexByte(v, ','); j >= 0 {
				v, hop = v[:j], v[j+1:]
			} else {
				v, hop = "", v
			}
			if forwarded {
				hop = forwardedFor(hop)
			}
			a, ok := parseHop(hop)
			if !ok {
				break hops
			}
			client = a
			if !inPrefixes(s.TrustedProxies, a) {
				break hops
			}
		}
	}
	if client.IsValid() {
		r.RemoteAddr = netip.AddrPortFrom(client.Unmap(), 0).String()
	}
}

// forwardedFor returns the for= value of one Forwarded element
// ("for=192.0.2.60;proto=http;by=203.0.113.43"), unquoted, or "".
func forwardedFor(elem string) string {
	for elem != "" {
		var pair string
		pair, elem, _ = strings.Cut(elem, ";")
		k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if ok && strings.EqualFold(k, "for") {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// parseHop parses one hop: an IP address, or "ip:port" / "[ipv6]:port" /
// "[ipv6]" (RFC 7239 node forms).
func parseHop(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return a, true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil && ap.Addr().Zone() == "" {
		return ap.Addr(), true
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil && a.Is6() && a.Zone() == "" {
			return a, true
		}
	}
	return netip.Addr{}, false
}
