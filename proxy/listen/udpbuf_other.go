//go:build !linux

package listen

import "net"

// udpBufferSizes is not checked on this system (quic-go logs its own
// warning where it can tell).
func udpBufferSizes(*net.UDPConn) (rcv, snd int, ok bool) { return 0, 0, false }
