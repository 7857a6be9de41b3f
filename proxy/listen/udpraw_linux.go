package listen

import (
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"unsafe"

	"github.com/quic-go/quic-go"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// quic-go keeps its UDP optimizations for a socket that is one of these
// (quic-go's sys_conn.go): recvmmsg through ReadBatch, GSO, ECN.
var (
	_ quic.OOBCapablePacketConn = (*rawSendConn)(nil)
	_ quic.OOBCapablePacketConn = (*rawUDPConn)(nil)
	_ interface {
		ReadBatch([]ipv4.Message, int) (int, error)
	} = (*rawUDPConn)(nil)
)

// H3RawSendEnv names the environment variable that turns rawSendConn off
// ("0"): quic-go then writes with net.UDPConn's WriteMsgUDP (and reads
// as H3RawRecvEnv=0).
const H3RawSendEnv = "SLUICE_H3_RAW_SEND"

// H3RawRecvEnv names the environment variable that turns rawUDPConn's
// receive side off ("0"): quic-go reads with x/net's ReadBatch.
const H3RawRecvEnv = "SLUICE_H3_RAW_RECV"

var (
	h3RawSend = os.Getenv(H3RawSendEnv) != "0"
	h3RawRecv = os.Getenv(H3RawRecvEnv) != "0"
)

// rawSendConn is the QUIC listener's UDP socket as quic-go sees it (an
// OOBCapablePacketConn: it keeps every optimization quic-go has for a
// *net.UDPConn, recvmmsg, GSO, ECN), with the one difference that a
// packet is written by sendmsg(2) as a raw system call on the socket
// (non-blocking), as the event loops write: net.UDPConn's WriteMsgUDP
// enters the system call through the runtime (entersyscall), which wakes
// the runtime's sysmon thread whenever the process had gone idle — once
// per packet burst here, a futex wake-up and sysmon's sleeps. A send the
// socket cannot take at once (EAGAIN) waits in the netpoller as before.
// See docs/BENCHMARKS.md, "h3cpu8".
type rawSendConn struct {
	*net.UDPConn
	rc     syscall.RawConn
	family int // the socket's address family: AF_INET or AF_INET6
}

// wrapRawSend returns c as quic-go's socket: a rawSendConn when the
// setting is on and the socket's family is known, else c itself.
func wrapRawSend(c *net.UDPConn) net.PacketConn {
	if !h3RawSend {
		return c
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return c
	}
	family, ferr := 0, error(nil)
	if err := rc.Control(func(fd uintptr) {
		family, ferr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DOMAIN)
	}); err != nil || ferr != nil || family != unix.AF_INET && family != unix.AF_INET6 {
		return c
	}
	sc := &rawSendConn{UDPConn: c, rc: rc, family: family}
	if !h3RawRecv {
		return sc
	}
	rc2 := &rawUDPConn{rawSendConn: sc}
	rc2.readFn = rc2.recv
	return rc2
}

// sendMsg is one sendmsg(2)'s arguments and result, pooled: built on
// the stack they would escape through the RawConn callback, several
// allocations per packet.
type sendMsg struct {
	msg   unix.Msghdr
	sa4   unix.RawSockaddrInet4
	sa6   unix.RawSockaddrInet6
	iov   unix.Iovec
	n     int
	errno syscall.Errno
	fn    func(fd uintptr) bool // send, bound once
}

var sendMsgs = sync.Pool{New: func() any {
	m := new(sendMsg)
	m.fn = m.send
	return m
}}

// send is the RawConn.Write callback: false (wait until writable) on
// EAGAIN.
func (m *sendMsg) send(fd uintptr) bool {
	r, _, errno := unix.RawSyscall(unix.SYS_SENDMSG, fd, uintptr(unsafe.Pointer(&m.msg)), 0)
	if errno == unix.EAGAIN {
		return false
	}
	m.n, m.errno = int(r), errno
	return true
}

// WriteMsgUDP is net.UDPConn's, written with a raw sendmsg(2). An address
// the socket's family cannot take as is (an IPv6 address on an IPv4
// socket, a zone) goes the standard way.
func (c *rawSendConn) WriteMsgUDP(b, oob []byte, addr *net.UDPAddr) (n, oobn int, err error) {
	if addr == nil || addr.Zone != "" {
		return c.UDPConn.WriteMsgUDP(b, oob, addr)
	}
	var ip []byte
	if c.family == unix.AF_INET {
		ip = addr.IP.To4()
	} else {
		ip = addr.IP.To16() // an IPv4 address in its v4-mapped form, as net sends it
	}
	if ip == nil {
		return c.UDPConn.WriteMsgUDP(b, oob, addr)
	}
	m := sendMsgs.Get().(*sendMsg)
	var port *[2]byte
	if c.family == unix.AF_INET {
		m.sa4 = unix.RawSockaddrInet4{Family: unix.AF_INET}
		copy(m.sa4.Addr[:], ip)
		port = (*[2]byte)(unsafe.Pointer(&m.sa4.Port))
		m.msg = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&m.sa4)), Namelen: unix.SizeofSockaddrInet4}
	} else {
		m.sa6 = unix.RawSockaddrInet6{Family: unix.AF_INET6}
		copy(m.sa6.Addr[:], ip)
		port = (*[2]byte)(unsafe.Pointer(&m.sa6.Port))
		m.msg = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&m.sa6)), Namelen: unix.SizeofSockaddrInet6}
	}
	port[0], port[1] = byte(addr.Port>>8), byte(addr.Port) // network byte order
	m.iov = unix.Iovec{}
	if len(b) > 0 {
		m.iov.Base = &b[0]
		m.iov.SetLen(len(b))
	}
	m.msg.Iov, m.msg.Iovlen = &m.iov, 1
	if len(oob) > 0 {
		m.msg.Control = &oob[0]
		m.msg.SetControllen(len(oob))
	}
	m.n, m.errno = 0, 0
	werr := c.rc.Write(m.fn)
	n, errno := m.n, m.errno
	m.msg, m.iov = unix.Msghdr{}, unix.Iovec{} // holds no packet in the pool
	sendMsgs.Put(m)
	if werr == nil && errno != 0 {
		werr = os.NewSyscallError("sendmsg", errno)
	}
	if werr != nil {
		return 0, 0, &net.OpError{Op: "write", Net: "udp", Source: c.LocalAddr(), Addr: addr, Err: werr}
	}
	return n, len(oob), nil
}

// rawUDPConn is rawSendConn that also reads with a raw recvmmsg(2) (the
// batchConn quic-go looks for), for the same reason: x/net's ReadBatch
// enters the system call through the runtime. Only quic-go's transport
// reads, from one goroutine; the mutex only keeps a second reader safe.
type rawUDPConn struct {
	*rawSendConn

	rmu    sync.Mutex
	hs     []unix.Mmsghdr
	iovs   []unix.Iovec
	names  []unix.RawSockaddrInet6 // large enough for either family
	n      int                     // the messages offered to recvmmsg
	flags  int
	got    int
	errno  syscall.Errno
	readFn func(fd uintptr) bool // recv, bound once
}

// recv is the RawConn.Read callback: false (wait until readable) on
// EAGAIN.
func (c *rawUDPConn) recv(fd uintptr) bool {
	r, _, errno := unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&c.hs[0])), uintptr(c.n),
		uintptr(c.flags), 0, 0)
	if errno == unix.EAGAIN {
		return false
	}
	c.got, c.errno = int(r), errno
	return true
}

// ReadBatch is x/net's ipv4.PacketConn's: it reads up to len(ms)
// packets, each into its message's one buffer (with its control
// messages and the sender's address), waiting until one is there.
// Messages of several buffers go x/net's way.
func (c *rawUDPConn) ReadBatch(ms []ipv4.Message, flags int) (int, error) {
	for i := range ms {
		if len(ms[i].Buffers) != 1 {
			return ipv4.NewPacketConn(c.UDPConn).ReadBatch(ms, flags)
		}
	}
	if len(ms) == 0 {
		return 0, nil
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	n := len(ms)
	if cap(c.hs) < n {
		c.hs, c.iovs, c.names = make([]unix.Mmsghdr, n), make([]unix.Iovec, n), make([]unix.RawSockaddrInet6, n)
	}
	hs := c.hs[:n]
	for i := range ms {
		b, oob := ms[i].Buffers[0], ms[i].OOB
		iov := &c.iovs[i]
		*iov = unix.Iovec{}
		if len(b) > 0 {
			iov.Base = &b[0]
			iov.SetLen(len(b))
		}
		h := &hs[i]
		*h = unix.Mmsghdr{Hdr: unix.Msghdr{Name: (*byte)(unsafe.Pointer(&c.names[i])),
			Namelen: unix.SizeofSockaddrInet6, Iov: iov, Iovlen: 1}}
		if len(oob) > 0 {
			h.Hdr.Control = &oob[0]
			h.Hdr.SetControllen(len(oob))
		}
	}
	c.n, c.flags, c.got, c.errno = n, flags, 0, 0
	err := c.rc.Read(c.readFn)
	got := c.got
	if err == nil && c.errno != 0 {
		err = os.NewSyscallError("recvmmsg", c.errno)
	}
	if err == nil {
		for i := range got {
			m, h := &ms[i], &hs[i]
			m.N, m.NN, m.Flags = int(h.Len), int(h.Hdr.Controllen), int(h.Hdr.Flags)
			m.Addr = sockaddrUDP(&c.names[i])
		}
	}
	for i := range hs { // hold no packet buffer
		hs[i], c.iovs[i] = unix.Mmsghdr{}, unix.Iovec{}
	}
	if err != nil {
		return 0, &net.OpError{Op: "read", Net: "udp", Source: c.LocalAddr(), Err: err}
	}
	return got, nil
}

// sockaddrUDP is the UDP address of a received packet's sender, as x/net
// gives it (an IPv6 zone as its interface index).
func sockaddrUDP(sa *unix.RawSockaddrInet6) *net.UDPAddr {
	switch sa.Family {
	case unix.AF_INET:
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		p := (*[2]byte)(unsafe.Pointer(&sa4.Port))
		return &net.UDPAddr{IP: append(net.IP(nil), sa4.Addr[:]...), Port: int(p[0])<<8 | int(p[1])}
	case unix.AF_INET6:
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		a := &net.UDPAddr{IP: append(net.IP(nil), sa.Addr[:]...), Port: int(p[0])<<8 | int(p[1])}
		if sa.Scope_id != 0 {
			a.Zone = strconv.FormatUint(uint64(sa.Scope_id), 10)
		}
		return a
	}
	return nil
}
