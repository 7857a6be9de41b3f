package listen

import (
	"context"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// listenTCP binds the cleartext listener. With SLUICE_REUSEPORT=1 in the
// environment (an experiment, off by default) the socket sets
// SO_REUSEPORT, so several `sluice serve` processes can share the port
// and the kernel spreads new connections over them, as nginx's workers
// do with `reuseport`. Nothing else is shared between such processes
// (each has its own limiter, routing view, metrics and reload).
func listenTCP(addr string) (net.Listener, error) {
	if os.Getenv("SLUICE_REUSEPORT") != "1" {
		return net.Listen("tcp", addr)
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	return lc.Listen(context.Background(), "tcp", addr)
}
