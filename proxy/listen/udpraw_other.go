//go:build !linux

package listen

import "net"

// H3RawSendEnv names the environment variable that turns the raw UDP
// send off; only Linux has it (udpraw_linux.go).
const H3RawSendEnv = "SLUICE_H3_RAW_SEND"

// wrapRawSend returns c: only Linux writes QUIC packets with a raw
// sendmsg(2).
func wrapRawSend(c *net.UDPConn) net.PacketConn { return c }
