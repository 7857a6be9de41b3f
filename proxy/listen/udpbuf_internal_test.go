package listen

import (
	"net"
	"runtime"
	"strings"
	"testing"
)

func TestBufferHint(t *testing.T) {
	if h := bufferHint(quicWantBuffer, quicWantBuffer); h != "" {
		t.Fatalf("hint for large enough buffers: %q", h)
	}
	h := bufferHint(208<<10, 8<<20)
	for _, want := range []string{"208 KiB receive", "sysctl -w net.core.rmem_max=7500000", "sysctl -w net.core.wmem_max=7500000", "restart Sluice"} {
		if !strings.Contains(h, want) {
			t.Errorf("hint %q lacks %q", h, want)
		}
	}
}

// The check reads the real socket: a UDP socket with small buffers gets
// the hint.
func TestUDPBufferHintReadsSocket(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("buffer sizes are read on Linux only")
	}
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetReadBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	if h := udpBufferHint(c); !strings.Contains(h, "sysctl -w net.core.rmem_max") {
		t.Fatalf("hint %q for a 64 KiB receive buffer; want the sysctl advice", h)
	}
}
