package listen

import (
	"fmt"
	"net"
)

// quicWantBuffer is the UDP buffer size quic-go asks the kernel for (and
// checks against, as reported by getsockopt) to keep up with fast links.
const quicWantBuffer = 7 << 20

// sysctlBuffer is the value the quic-go documentation recommends setting
// (the kernel doubles it, so the check above passes).
const sysctlBuffer = 7500000

// udpBufferHint checks the buffers of the QUIC socket (after quic-go tried
// to enlarge them) and returns a hint for the operator when they are too
// small, or "".
func udpBufferHint(c *net.UDPConn) string {
	rcv, snd, ok := udpBufferSizes(c)
	if !ok {
		return ""
	}
	return bufferHint(rcv, snd)
}

// bufferHint words the hint for the given sizes (bytes, as getsockopt
// reports them).
func bufferHint(rcv, snd int) string {
	if rcv >= quicWantBuffer && snd >= quicWantBuffer {
		return ""
	}
	return fmt.Sprintf("HTTP/3: the kernel limits UDP socket buffers to %d KiB receive / %d KiB send; "+
		"QUIC wants %d KiB to keep up with fast or lossy links. Raise the limits (as root) and restart Sluice:\n"+
		"    sysctl -w net.core.rmem_max=%d\n"+
		"    sysctl -w net.core.wmem_max=%d\n"+
		"  (put the same settings in /etc/sysctl.d/ to keep them across reboots)",
		rcv>>10, snd>>10, quicWantBuffer>>10, sysctlBuffer, sysctlBuffer)
}
