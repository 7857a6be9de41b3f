package listen

import (
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sluice-proxy/sluice/proxy/internal/rawsock"
)

// tcpRTT reads the kernel's smoothed RTT of a TCP socket (TCP_INFO).
func tcpRTT(raw syscall.RawConn) time.Duration {
	var rtt uint32
	raw.Control(func(fd uintptr) { rtt = tcpInfoRTT(fd) })
	return time.Duration(rtt) * time.Microsecond
}

// tcpInfoRTT is getsockopt(TCP_INFO)'s tcpi_rtt (µs), 0 when it fails.
// The call goes through RawSyscall into a struct on the stack, as the
// request path's socket calls do (proxy/internal/rawsock: no entersyscall,
// so the first one after the process went idle does not wake sysmon from
// its deep sleep; getsockopt never waits). unix.GetsockoptTCPInfo enters
// through Syscall and allocates the struct: it was the one call of a
// stream's start that woke sysmon (docs/BENCHMARKS.md, "start19").
// SLUICE_RAW_SOCKETS=0 keeps it.
func tcpInfoRTT(fd uintptr) uint32 {
	if !rawsock.On {
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			return info.Rtt
		}
		return 0
	}
	var info unix.TCPInfo
	n := uint32(unix.SizeofTCPInfo)
	_, _, e := unix.RawSyscall6(unix.SYS_GETSOCKOPT, fd, unix.IPPROTO_TCP, unix.TCP_INFO,
		uintptr(unsafe.Pointer(&info)), uintptr(unsafe.Pointer(&n)), 0)
	if e != 0 || uintptr(n) < unsafe.Offsetof(info.Rtt)+unsafe.Sizeof(info.Rtt) {
		return 0 // failed, or a struct too short to hold tcpi_rtt
	}
	return info.Rtt
}
