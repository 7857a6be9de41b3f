package listen

import (
	"net"

	"github.com/sluice-proxy/sluice/proxy/internal/rawsock"
)

// rawSockOf returns the socket under c, a cleartext TCP connection of this
// package (under its counting, PROXY-header and re-admission wrappers),
// for raw reads and writes (proxy/internal/rawsock: no entersyscall per
// call, so no sysmon wake-up and no retaken P per request); nil for any
// other connection (TLS, a test's net.Pipe), or when SLUICE_RAW_SOCKETS=0:
// its caller then reads and writes c. Made once per connection. The
// wrappers pass Read and Write through to the socket, except for the bytes
// some of them read ahead: Read goes through c while any is left.
func rawSockOf(c net.Conn) *rawsock.Conn {
	if !rawsock.On {
		return nil
	}
	top := c
	var pend []func() bool
	for range 8 {
		switch t := c.(type) {
		case *net.TCPConn:
			rc, err := t.SyscallConn()
			if err != nil {
				return nil
			}
			s := rawsock.New(top, rc)
			if s != nil && len(pend) > 0 {
				s.Pending = func() bool {
					for _, p := range pend {
						if p() {
							return true
						}
					}
					return false
				}
			}
			return s
		case *capConn:
			c = t.Conn
		case *keptConn:
			if len(t.prefix) > 0 {
				pend = append(pend, func() bool { return len(t.prefix) > 0 })
			}
			c = t.Conn
		case *proxyConn:
			if len(t.pending) > 0 {
				pend = append(pend, func() bool { return len(t.pending) > 0 })
			}
			c = t.Conn
		case *replayConn:
			if len(t.prefix) > 0 {
				pend = append(pend, func() bool { return len(t.prefix) > 0 })
			}
			c = t.Conn
		default:
			return nil
		}
	}
	return nil
}
