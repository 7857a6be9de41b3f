package listen

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"testing"
)

// The encoders below are written from the spec
// (haproxy.org/download/2.x/doc/proxy-protocol.txt, sections 2.1 and 2.2),
// not from the parser: tests use them as a load balancer would.

// ProxyV1Header is a v1 header (spec 2.1): "PROXY TCP4|TCP6 src dst
// sport dport\r\n"; an invalid src gives "PROXY UNKNOWN\r\n".
func ProxyV1Header(src, dst netip.AddrPort) []byte {
	if !src.IsValid() {
		return []byte("PROXY UNKNOWN\r\n")
	}
	proto := "TCP4"
	if src.Addr().Is6() {
		proto = "TCP6"
	}
	return fmt.Appendf(nil, "PROXY %s %s %s %d %d\r\n", proto, src.Addr(), dst.Addr(), src.Port(), dst.Port())
}

// ProxyV2Header is a v2 header (spec 2.2): the 12-byte signature
// \x0D\x0A\x0D\x0A\x00\x0D\x0A\x51\x55\x49\x54\x0A, 0x21 (version 2,
// PROXY) or 0x20 (LOCAL, when src is invalid), 0x11 (AF_INET, STREAM) or
// 0x21 (AF_INET6, STREAM) or 0x00 (UNSPEC, for LOCAL), the length of the
// rest (big endian), the addresses and ports, then the TLVs (type, length
// big endian, value).
func ProxyV2Header(src, dst netip.AddrPort, tlvs ...[]byte) []byte {
	b := []byte{0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A}
	var addrs []byte
	switch {
	case !src.IsValid():
		b = append(b, 0x20, 0x00)
	case src.Addr().Is4():
		b = append(b, 0x21, 0x11)
		s, d := src.Addr().As4(), dst.Addr().As4()
		addrs = append(append(addrs, s[:]...), d[:]...)
	default:
		b = append(b, 0x21, 0x21)
		s, d := src.Addr().As16(), dst.Addr().As16()
		addrs = append(append(addrs, s[:]...), d[:]...)
	}
	if src.IsValid() {
		addrs = binary.BigEndian.AppendUint16(addrs, src.Port())
		addrs = binary.BigEndian.AppendUint16(addrs, dst.Port())
	}
	for _, v := range tlvs {
		addrs = append(addrs, 0x04) // PP2_TYPE_NOOP
		addrs = binary.BigEndian.AppendUint16(addrs, uint16(len(v)))
		addrs = append(addrs, v...)
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(addrs)))
	return append(b, addrs...)
}

func parse(b []byte) (proxyHeader, []byte, error) {
	br := bufio.NewReaderSize(bytes.NewReader(b), 256)
	h, err := readProxyHeader(br)
	rest, _ := io.ReadAll(br)
	return h, rest, err
}

func TestParseProxyHeaderBothVersions(t *testing.T) {
	src4, dst4 := netip.MustParseAddrPort("203.0.113.7:51234"), netip.MustParseAddrPort("10.0.0.5:443")
	src6, dst6 := netip.MustParseAddrPort("[2001:db8::42]:40000"), netip.MustParseAddrPort("[2001:db8::1]:8443")
	long := []byte("PROXY UNKNOWN ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n")
	if len(long) != maxV1Header {
		t.Fatalf("the spec's longest v1 header is %d bytes here", len(long))
	}
	for _, c := range []struct {
		name string
		hdr  []byte
		src  netip.AddrPort // invalid: the connection's own
	}{
		{"v1 TCP4", ProxyV1Header(src4, dst4), src4},
		{"v1 TCP6", ProxyV1Header(src6, dst6), src6},
		{"v1 UNKNOWN", ProxyV1Header(netip.AddrPort{}, netip.AddrPort{}), netip.AddrPort{}},
		{"v1 UNKNOWN with addresses", []byte("PROXY UNKNOWN 1.2.3.4 5.6.7.8 1 2\r\n"), netip.AddrPort{}},
		{"v1 longest (spec 2.1)", long, netip.AddrPort{}},
		{"v1 TCP6 longest", []byte("PROXY TCP6 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n"),
			netip.MustParseAddrPort("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535")},
		{"v2 AF_INET", ProxyV2Header(src4, dst4), src4},
		{"v2 AF_INET6", ProxyV2Header(src6, dst6), src6},
		{"v2 TLVs skipped", ProxyV2Header(src4, dst4, []byte("aws-vpce-0123"), bytes.Repeat([]byte{7}, 600)), src4},
		{"v2 LOCAL", ProxyV2Header(netip.AddrPort{}, netip.AddrPort{}), netip.AddrPort{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, rest, err := parse(append(bytes.Clone(c.hdr), "GET / HTTP/1.1\r\n"...))
			if err != nil {
				t.Fatal(err)
			}
			if string(rest) != "GET / HTTP/1.1\r\n" {
				t.Fatalf("bytes after the header = %q", rest)
			}
			if !c.src.IsValid() {
				if h.src != nil {
					t.Fatalf("src = %v; want the connection's own", h.src)
				}
				return
			}
			if h.src == nil || h.src.AddrPort() != c.src {
				t.Fatalf("src = %v; want %v", h.src, c.src)
			}
		})
	}
}

func TestParseProxyHeaderRefusesMalformed(t *testing.T) {
	src, dst := netip.MustParseAddrPort("203.0.113.7:5"), netip.MustParseAddrPort("10.0.0.5:443")
	v2 := ProxyV2Header(src, dst)
	withByte := func(i int, b byte) []byte { c := bytes.Clone(v2); c[i] = b; return c }
	shortLen := bytes.Clone(v2)
	binary.BigEndian.PutUint16(shortLen[14:], 11)
	for _, c := range []struct{ name, in string }{
		{"no header (HTTP)", "GET / HTTP/1.1\r\n\r\n"},
		{"no header (TLS)", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"},
		{"v1 over 107 bytes", "PROXY UNKNOWN " + strings.Repeat("1", 92) + "\r\n"},
		{"v1 without CR", "PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n"},
		{"v1 TCP4 with IPv6", "PROXY TCP4 ::1 ::1 1 2\r\n"},
		{"v1 TCP6 with IPv4", "PROXY TCP6 1.2.3.4 5.6.7.8 1 2\r\n"},
		{"v1 port too big", "PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n"},
		{"v1 leading zero port", "PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n"},
		{"v1 missing field", "PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n"},
		{"v1 protocol", "PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n"},
		{"v1 truncated", "PROXY TCP4 1.2.3.4"},
		{"v2 version 1", string(withByte(12, 0x11))},
		{"v2 command 2", string(withByte(12, 0x22))},
		{"v2 family 4", string(withByte(13, 0x41))},
		{"v2 length below addresses", string(shortLen)},
		{"v2 truncated", string(v2[:20])},
		{"v2 signature cut", string(v2[:8])},
	} {
		t.Run(c.name, func(t *testing.T) {
			if h, _, err := parse([]byte(c.in)); err == nil {
				t.Fatalf("accepted %q as %+v", c.in, h)
			}
		})
	}
	if _, _, err := parse([]byte("GET / HTTP/1.1\r\n")); !errors.Is(err, errNoHeader) {
		t.Fatalf("HTTP without header: %v; want errNoHeader", err)
	}
}

// FuzzParseProxyHeader: any input is parsed or refused without a panic;
// a header takes exactly its own bytes (v1: through the first LF, at most
// 107; v2: 16 plus its length field), so the bytes after it are never lost.
func FuzzParseProxyHeader(f *testing.F) {
	src, dst := netip.MustParseAddrPort("203.0.113.7:5"), netip.MustParseAddrPort("10.0.0.5:443")
	src6 := netip.MustParseAddrPort("[2001:db8::42]:40000")
	f.Add(ProxyV1Header(src, dst))
	f.Add(ProxyV1Header(src6, src6))
	f.Add(ProxyV1Header(netip.AddrPort{}, netip.AddrPort{}))
	f.Add(ProxyV2Header(src, dst, []byte("x")))
	f.Add(ProxyV2Header(src6, src6))
	f.Add(ProxyV2Header(netip.AddrPort{}, netip.AddrPort{}))
	f.Add([]byte("GET / HTTP/1.1\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, rest, err := parse(b)
		if err != nil {
			return
		}
		consumed := len(b) - len(rest)
		var want int
		if h.version == 2 {
			want = 16 + int(binary.BigEndian.Uint16(b[14:16]))
		} else {
			want = bytes.IndexByte(b, '\n') + 1
			if consumed > maxV1Header {
				t.Fatalf("v1 header of %d bytes accepted", consumed)
			}
		}
		if consumed != want {
			t.Fatalf("v%d header consumed %d bytes; its own are %d", h.version, consumed, want)
		}
		if (h.src == nil) != (h.dst == nil) {
			t.Fatalf("half an address pair: %+v", h)
		}
	})
}
