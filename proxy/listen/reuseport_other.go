//go:build !linux

package listen

import "net"

// listenTCP binds the cleartext listener (SLUICE_REUSEPORT is Linux's).
func listenTCP(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }
