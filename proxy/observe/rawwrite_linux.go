package observe

import (
	"io"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawOut is the node's log destination (stderr) written with raw system
// calls when that cannot wait on another process: a regular file or a
// character device (/dev/null, a terminal) through write(2), a socket
// (journald's stream) through send(MSG_DONTWAIT). os.File's Write goes
// through syscall.Syscall, whose entersyscall wakes the runtime's sysmon
// from its deep sleep and puts it back on 20 µs polls: on a node serving
// small requests the access log's line was the last such call per request
// (docs/BENCHMARKS.md, "alograw"), about 7 % of the node's CPU with the
// wake-ups it caused, where the write itself costs about 2 µs. A raw call
// holds its P for the call, as the event loops' reads and writes do
// (proxy/evloop/raw.go): a file write on a stalled disk then holds one P
// (nginx's worker waits whole on the same write). A pipe (a container
// runtime's log) keeps os.File's Write: its reader may stall for long.
type rawOut struct {
	f    *os.File // for what a raw call cannot finish (EAGAIN: a full socket buffer)
	fd   uintptr
	sock bool
	slow int // Writes finished by os.File's Write (LogWriter's mutex guards it)
}

// rawLogOut returns w as a rawOut when it is an *os.File on a regular
// file, a character device or a socket; else w itself.
func rawLogOut(w io.Writer) io.Writer {
	f, ok := w.(*os.File)
	if !ok || os.Getenv("SLUICE_LOG_RAW") == "0" {
		return w
	}
	sc, err := f.SyscallConn()
	if err != nil {
		return w
	}
	var fd uintptr
	var st unix.Stat_t
	var serr error
	if err := sc.Control(func(d uintptr) { fd, serr = d, unix.Fstat(int(d), &st) }); err != nil || serr != nil {
		return w
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG, unix.S_IFCHR:
		return &rawOut{f: f, fd: fd}
	case unix.S_IFSOCK:
		return &rawOut{f: f, fd: fd, sock: true}
	}
	return w
}

// Write writes all of p: raw calls while they make progress, then
// os.File's Write for the rest (a socket whose buffer is full, EAGAIN).
func (o *rawOut) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		var r uintptr
		var e unix.Errno
		ptr := uintptr(unsafe.Pointer(&p[n]))
		if o.sock {
			r, _, e = unix.RawSyscall6(unix.SYS_SENDTO, o.fd, ptr, uintptr(len(p)-n), unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, 0, 0)
		} else {
			r, _, e = unix.RawSyscall(unix.SYS_WRITE, o.fd, ptr, uintptr(len(p)-n))
		}
		switch {
		case e == unix.EINTR:
			continue
		case e == unix.EAGAIN:
			o.slow++
			m, err := o.f.Write(p[n:])
			return n + m, err
		case e != 0:
			return n, &os.PathError{Op: "write", Path: o.f.Name(), Err: e}
		case r == 0:
			return n, io.ErrShortWrite
		}
		n += int(r)
	}
	return n, nil
}
