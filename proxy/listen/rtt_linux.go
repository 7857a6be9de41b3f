package listen

import (
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// tcpRTT reads the kernel's smoothed RTT of a TCP socket (TCP_INFO).
func tcpRTT(raw syscall.RawConn) time.Duration {
	var rtt uint32
	raw.Control(func(fd uintptr) {
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			rtt = info.Rtt
		}
	})
	return time.Duration(rtt) * time.Microsecond
}
