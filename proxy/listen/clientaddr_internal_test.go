package listen

import (
	"net/http"
	"net/netip"
	"testing"
)

// FuzzClientAddressHeader: whatever a trusted proxy passes on in
// X-Forwarded-For or Forwarded, parsing does not panic and the client is
// the peer or a plain address (port 0, no zone) that logs and caps can use.
func FuzzClientAddressHeader(f *testing.F) {
	f.Add("6.6.6.6, 203.0.113.7, 10.1.2.3", false)
	f.Add(`for=6.6.6.6, for="[2001:db8::42]:4711";proto=https, for=10.1.2.3`, true)
	f.Add("unknown, _hidden, ,,", true)
	f.Add(`for="`, true)
	s := &Server{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("127.0.0.0/8")}}
	f.Fuzz(func(t *testing.T, v string, forwarded bool) {
		s.ClientHeader = HeaderXForwardedFor
		name := "X-Forwarded-For"
		if forwarded {
			s.ClientHeader, name = HeaderForwarded, "Forwarded"
		}
		r := &http.Request{RemoteAddr: "127.0.0.1:5555", Header: http.Header{name: {v}}}
		s.realClient(r)
		if r.RemoteAddr == "127.0.0.1:5555" {
			return
		}
		ap, err := netip.ParseAddrPort(r.RemoteAddr)
		if err != nil || ap.Port() != 0 || ap.Addr().Zone() != "" {
			t.Fatalf("client %q from %q", r.RemoteAddr, v)
		}
	})
}
