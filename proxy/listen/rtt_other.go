//go:build !linux

package listen

import (
	"syscall"
	"time"
)

// tcpRTT is not available on this system: TCP_INFO is read on Linux only.
func tcpRTT(syscall.RawConn) time.Duration { return 0 }
