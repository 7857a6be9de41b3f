package observe

import (
	"io"
	"sync"
	"time"
)

// LogWriter is the node's log stream: the slog lines and the access log
// lines go through it to one io.Writer (stderr), whole lines in one Write
// each, never interleaved.
//
// Unbuffered (the default) it writes every line at once. With a buffer
// (SetBuffer: nginx's `access_log ... buffer=size flush=time`), access log
// lines are collected in memory and written together: when the next line
// would not fit, when the oldest buffered line is flush old (a timer the
// writer owns), before any other log line (so lines keep their order and
// a warning is never held back), and on Flush or Close. Lines still in the
// buffer when the process dies without Close (a crash, SIGKILL) are lost:
// at most one buffer, or flush's worth of requests.
type LogWriter struct {
	mu     sync.Mutex
	w      io.Writer
	buf    []byte        // buffered lines; cap is the buffer size, nil when unbuffered
	flush  time.Duration // age at which the buffer is written
	timer  *time.Timer   // armed while buf holds lines
	armed  bool
	closed bool
}

// NewLogWriter returns an unbuffered LogWriter writing to w. When w is an
// *os.File on a regular file, a character device or a socket, on Linux,
// its lines go out through raw system calls (rawwrite_linux.go; the
// environment's SLUICE_LOG_RAW=0 keeps os.File's Write).
func NewLogWriter(w io.Writer) *LogWriter { return &LogWriter{w: rawLogOut(w)} }

// SetBuffer buffers access log lines up to size bytes for at most flush
// (which must be positive when size is). Size 0 writes every line at once.
// What was buffered under the old setting is written first.
func (l *LogWriter) SetBuffer(size int, flush time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flushLocked()
	if size <= 0 || flush <= 0 || l.closed {
		l.buf = nil
		return
	}
	l.buf = make([]byte, 0, size)
	l.flush = flush
	if l.timer == nil {
		l.timer = time.AfterFunc(time.Hour, l.onTimer)
		l.timer.Stop()
	}
}

// Write writes p, one whole log line, at once, after whatever is buffered
// (in the same write(2) when both fit in the buffer). It is what slog's
// handlers write to.
func (l *LogWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > 0 && len(l.buf)+len(p) <= cap(l.buf) {
		l.buf = append(l.buf, p...)
		if err := l.flushLocked(); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	l.flushLocked()
	return l.w.Write(p)
}

// line takes one access log line: buffered when a buffer is set, else
// written at once. A line larger than the buffer is written on its own.
func (l *LogWriter) line(p []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buf == nil {
		l.w.Write(p) // a log that cannot be written must not fail the request
		return
	}
	if len(l.buf)+len(p) > cap(l.buf) {
		l.flushLocked()
		if len(p) > cap(l.buf) {
			l.w.Write(p)
			return
		}
	}
	l.buf = append(l.buf, p...)
	if !l.armed {
		l.armed = true
		l.timer.Reset(l.flush)
	}
}

// onTimer writes the buffer its oldest line has waited flush for.
func (l *LogWriter) onTimer() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.armed = false
	l.flushLocked()
}

// flushLocked writes the buffered lines in one Write and disarms the timer.
func (l *LogWriter) flushLocked() error {
	if l.armed {
		l.timer.Stop()
		l.armed = false
	}
	if len(l.buf) == 0 {
		return nil
	}
	_, err := l.w.Write(l.buf)
	l.buf = l.buf[:0]
	return err
}

// Flush writes the buffered lines now.
func (l *LogWriter) Flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.flushLocked()
}

// Close writes the buffered lines and stops the timer; later lines are
// written at once (unbuffered). The underlying writer is not closed.
func (l *LogWriter) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	err := l.flushLocked()
	l.closed = true
	l.buf = nil
	if l.timer != nil {
		l.timer.Stop()
	}
	return err
}
