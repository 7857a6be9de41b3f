package evloop

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The loop's per-event system calls (read(2) of a ready backend, write(2)
// to its client) go through RawSyscall, not Syscall as unix.Read and
// unix.Write do. Their sockets are non-blocking, so the calls never wait;
// Syscall's bookkeeping (entersyscall and exitsyscall) buys nothing for
// them and costs twice per call: its own work, and, on a node that
// relays many sparse tokens, waking sysmon: the first system call after
// the process went idle wakes sysmon from its deep sleep and puts it back
// on 20 µs polls, which it keeps up for at least 1 ms. With two to four
// wake-ups per millisecond at 6,400 tokens/s, sysmon was a fifth of
// Sluice's CPU on docs/benchmarks/run.sh target 1 (docs/BENCHMARKS.md,
// "eventcost"). A raw call holds its P for the call (a few µs): the
// garbage collector's stop-the-world waits that long at worst.

// rawRead is unix.Read on a non-blocking descriptor.
func rawRead(fd int, p []byte) (int, error) {
	var ptr unsafe.Pointer
	if len(p) > 0 {
		ptr = unsafe.Pointer(&p[0])
	}
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(ptr), uintptr(len(p)))
	if e != 0 {
		return -1, errnoErr(e)
	}
	return int(n), nil
}

// rawWrite is unix.Write on a non-blocking descriptor.
func rawWrite(fd int, p []byte) (int, error) {
	var ptr unsafe.Pointer
	if len(p) > 0 {
		ptr = unsafe.Pointer(&p[0])
	}
	n, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(ptr), uintptr(len(p)))
	if e != 0 {
		return -1, errnoErr(e)
	}
	return int(n), nil
}

// errnoErr returns the common errors as their constants (no allocation;
// the loop compares them with ==).
func errnoErr(e unix.Errno) error {
	switch e {
	case unix.EAGAIN:
		return unix.EAGAIN
	case unix.EINTR:
		return unix.EINTR
	}
	return e
}

// rawEpollWait is unix.EpollWait with a zero timeout (it never waits).
func rawEpollWait(epfd int, events []unix.EpollEvent) (int, error) {
	var ptr unsafe.Pointer
	if len(events) > 0 {
		ptr = unsafe.Pointer(&events[0])
	}
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(ptr), uintptr(len(events)), 0, 0, 0)
	if e != 0 {
		return -1, errnoErr(e)
	}
	return int(n), nil
}

// rawEpollCtl is unix.EpollCtl through RawSyscall: epoll_ctl never waits,
// and the loop's goroutine (which calls it per stream's start and end)
// must not wake sysmon from its deep sleep (see above).
func rawEpollCtl(epfd, op, fd int, ev *unix.EpollEvent) error {
	_, _, e := unix.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(epfd), uintptr(op), uintptr(fd), uintptr(unsafe.Pointer(ev)), 0, 0)
	if e != 0 {
		return errnoErr(e)
	}
	return nil
}
