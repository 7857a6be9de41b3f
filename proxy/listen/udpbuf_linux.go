package listen

import (
	"net"

	"golang.org/x/sys/unix"
)

// udpBufferSizes reads a UDP socket's receive and send buffer sizes as the
// kernel reports them.
func udpBufferSizes(c *net.UDPConn) (rcv, snd int, ok bool) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, 0, false
	}
	var rerr, serr error
	err = raw.Control(func(fd uintptr) {
		rcv, rerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
		snd, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
	})
	return rcv, snd, err == nil && rerr == nil && serr == nil
}
