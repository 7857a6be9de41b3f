//go:build !linux

package rawsock

import (
	"net"
	"syscall"
)

// Conn is not implemented outside Linux: New and Of return nil and
// callers use the net.Conn.
type Conn struct {
	Pending func() bool
}

func New(nc net.Conn, rc syscall.RawConn) *Conn { return nil }
func Of(nc net.Conn) *Conn                      { return nil }

func (c *Conn) Read(p []byte) (int, error)  { panic("rawsock: not implemented") }
func (c *Conn) Write(p []byte) (int, error) { panic("rawsock: not implemented") }

// WriteFD is syscall.Write outside Linux.
func WriteFD(fd uintptr, p []byte) (int, error) { return syscall.Write(int(fd), p) }
