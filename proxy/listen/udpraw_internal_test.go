//go:build linux

package listen

import (
	"bytes"
	"errors"
	"net"
	"os"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// rawSendConn's packets arrive whole, from the socket's address, on IPv4,
// IPv6 and dual-stack sockets (an IPv4 peer of an IPv6 socket), with
// control messages; a failed send reports the system call's error as
// net does (quic-go reads the errno from an *os.SyscallError).
func TestRawSendConn(t *testing.T) {
	if !h3RawSend {
		t.Skip(H3RawSendEnv + "=0")
	}
	cases := []struct{ name, local, peer string }{
		{"ipv4", "127.0.0.1:0", "127.0.0.1:0"},
		{"ipv6", "[::1]:0", "[::1]:0"},
		{"dual-stack to ipv4", ":0", "127.0.0.1:0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pc, err := net.ListenPacket("udp", tc.local)
			if err != nil {
				t.Skip(err)
			}
			defer pc.Close()
			peer, err := net.ListenPacket("udp", tc.peer)
			if err != nil {
				t.Skip(err)
			}
			defer peer.Close()
			var c *rawSendConn
			var rc *rawUDPConn
			switch w := wrapRawSend(pc.(*net.UDPConn)).(type) {
			case *rawUDPConn:
				c, rc = w.rawSendConn, w
			case *rawSendConn:
				c = w
			default:
				t.Fatalf("not wrapped: %T", w)
			}
			to := peer.LocalAddr().(*net.UDPAddr)
			// a TOS control message, as quic-go sends ECN marks
			var oob []byte
			if to.IP.To4() != nil && c.family == unix.AF_INET {
				oob = make([]byte, unix.CmsgSpace(4))
				h := (*unix.Cmsghdr)(unsafePointer(&oob[0]))
				h.Level, h.Type = unix.IPPROTO_IP, unix.IP_TOS
				h.SetLen(unix.CmsgLen(4))
				oob[unix.CmsgLen(0)] = 0x02 // ECT(0)
			}
			for i := range 3 {
				msg := bytes.Repeat([]byte{byte('a' + i)}, 100+i*500)
				n, oobn, err := c.WriteMsgUDP(msg, oob, to)
				if err != nil || n != len(msg) || oobn != len(oob) {
					t.Fatalf("WriteMsgUDP: %d, %d, %v", n, oobn, err)
				}
				buf := make([]byte, 2048)
				peer.SetReadDeadline(time.Now().Add(5 * time.Second))
				m, from, err := peer.ReadFrom(buf)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(buf[:m], msg) {
					t.Fatalf("packet %d: got %d bytes, want %d", i, m, len(msg))
				}
				if got, want := from.(*net.UDPAddr).Port, c.LocalAddr().(*net.UDPAddr).Port; got != want {
					t.Fatalf("from port %d, want %d", got, want)
				}
			}
			if rc != nil {
				testReadBatch(t, rc, peer)
			}
			// a packet larger than UDP allows: EMSGSIZE, as net reports it
			_, _, err = c.WriteMsgUDP(make([]byte, 70000), nil, to)
			var se *os.SyscallError
			if !errors.As(err, &se) || !errors.Is(err, unix.EMSGSIZE) {
				t.Fatalf("oversized packet: %v, want an *os.SyscallError with EMSGSIZE", err)
			}
		})
	}
}

func unsafePointer(b *byte) unsafe.Pointer { return unsafe.Pointer(b) }

// testReadBatch: packets sent to rc arrive whole through ReadBatch, with
// their sender's address, several in one call when queued.
func testReadBatch(t *testing.T, rc *rawUDPConn, peer net.PacketConn) {
	t.Helper()
	want := [][]byte{[]byte("one"), bytes.Repeat([]byte("2"), 1200), []byte("three")}
	to := &net.UDPAddr{IP: peer.LocalAddr().(*net.UDPAddr).IP, Port: rc.LocalAddr().(*net.UDPAddr).Port}
	for _, p := range want {
		if _, err := peer.WriteTo(p, to); err != nil {
			t.Fatal(err)
		}
	}
	ms := make([]ipv4.Message, 8)
	for i := range ms {
		ms[i].Buffers = [][]byte{make([]byte, 1500)}
		ms[i].OOB = make([]byte, 128)
	}
	var got [][]byte
	rc.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer rc.SetReadDeadline(time.Time{})
	for len(got) < len(want) {
		n, err := rc.ReadBatch(ms, 0)
		if err != nil {
			t.Fatalf("ReadBatch: %v", err)
		}
		for _, m := range ms[:n] {
			got = append(got, append([]byte(nil), m.Buffers[0][:m.N]...))
			from, ok := m.Addr.(*net.UDPAddr)
			if !ok || from.Port != peer.LocalAddr().(*net.UDPAddr).Port {
				t.Fatalf("from %v, want %v", m.Addr, peer.LocalAddr())
			}
			if m.NN < 0 || m.NN > len(m.OOB) {
				t.Fatalf("NN %d", m.NN)
			}
		}
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("packet %d: %d bytes, want %d", i, len(got[i]), len(want[i]))
		}
	}
	// the deadline ends a wait with the net error quic-go expects
	rc.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	if _, err := rc.ReadBatch(ms, 0); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("ReadBatch past the deadline: %v", err)
	}
}
