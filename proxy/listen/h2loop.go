package listen

import (
	"net"
	"net/http"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sluice-proxy/sluice/proxy/evloop"
)

// A committed response stream of Sluice's HTTP/2 server relayed by an
// event loop (proxy/evloop) instead of its handler's goroutine: the loop
// frames what it relays as DATA into the connection's buffer under c.mu
// (within the stream's and the connection's flow-control windows and the
// buffer's bound) and never writes the socket itself: once per batch it
// wakes the connection's writer goroutine (Flush), which writes the buffer
// (flushLocked, as any writer of the connection does). A stream out of
// credit waits in c.blocked; a WINDOW_UPDATE, a SETTINGS change of the
// initial window or a write that emptied the buffer resumes it through
// its loop's command queue. A reset or the connection's end reaches the
// loop the same way (peerReset: Waker.Gone). See docs/ARCHITECTURE.md,
// "Event loop".

// H2LoopStream is a stream of Sluice's HTTP/2 server handed to an event
// loop: its evloop.ClientSink.
type H2LoopStream struct{ st *h2stream }

var _ evloop.ClientSink = (*H2LoopStream)(nil)

// DetachH2 hands the response stream of w (the handler's ResponseWriter)
// over to an event loop: when the handler returns, the stream stays open
// for the returned sink, which ends it (Close). The response's header and
// everything written must have been flushed. It reports false, changing
// nothing, when w is not a stream of Sluice's HTTP/2 server or the stream
// can no longer be written (reset, the connection ended).
func DetachH2(w http.ResponseWriter) (*H2LoopStream, bool) {
	st, ok := w.(*h2stream)
	if !ok || !st.sentHeader || st.ended || st.outOff < len(st.out) {
		return nil, false
	}
	c := st.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.writeErrLocked() != nil || st.ctx.Err() != nil {
		return nil, false
	}
	st.loop = true
	if !c.writerOn {
		c.writerOn = true
		go c.writeLoop()
	}
	return &H2LoopStream{st: st}, true
}

// Reattach gives the stream back to its handler (no loop took it); it
// must be called before the handler returns.
func (s *H2LoopStream) Reattach() {
	c := s.st.c
	c.mu.Lock()
	s.st.loop = false
	c.mu.Unlock()
}

// SetTrailer sets the trailer fields Close sends (the stream's end is then
// a HEADERS frame instead of an empty DATA frame).
func (s *H2LoopStream) SetTrailer(h http.Header) {
	if len(h) == 0 {
		return
	}
	fields := make([]hpack.HeaderField, 0, len(h))
	for k, vv := range h {
		for _, v := range vv {
			fields = append(fields, hpack.HeaderField{Name: strings.ToLower(k), Value: v})
		}
	}
	c := s.st.c
	c.mu.Lock()
	s.st.ltrailer = fields
	c.mu.Unlock()
}

// Attach is evloop.ClientSink's: a stream reset (or a connection ended)
// before it is reported at once.
func (s *H2LoopStream) Attach(w evloop.Waker) {
	st := s.st
	c := st.c
	c.mu.Lock()
	st.waker = w
	gone := st.reset || c.closed
	c.mu.Unlock()
	if gone {
		w.Gone()
	}
}

// Write is evloop.ClientSink's: p goes into the connection's buffer as
// DATA frames, as far as the windows and the buffer's bound let it; the
// stream waits in c.blocked for the rest.
func (s *H2LoopStream) Write(p []byte) (int, error) {
	st := s.st
	c := st.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := st.writeErrLocked(); err != nil {
		return 0, err
	}
	n := 0
	for n < len(p) {
		k := int64(min(len(p)-n, c.maxFrame))
		k = min(k, st.sendWin, c.sendConn)
		if k <= 0 || len(c.w.buf) >= maxBuffered {
			if !st.blocked {
				st.blocked = true
				c.blocked = append(c.blocked, st)
			}
			break
		}
		c.w.data(st.id, p[n:n+int(k)], false)
		n += int(k)
		st.sendWin -= k
		c.sendConn -= k
	}
	return n, nil
}

// Flush is evloop.ClientSink's. When no write is under way and the
// socket has almost nothing unsent (roomFor: the write does not wait),
// the loop writes the buffer itself, with no other goroutine woken;
// else it wakes the connection's writer (a no-op when it is awake
// already), which writes it.
func (s *H2LoopStream) Flush() {
	c := s.st.c
	c.mu.Lock()
	w := &c.w
	if w.flushing || w.err != nil || len(w.buf) == 0 {
		c.mu.Unlock()
		return // the write under way takes the buffer (or nothing to do)
	}
	if c.roomFor(len(w.buf)) {
		c.writeBufLocked()
		more := len(w.buf) > 0 && w.err == nil
		if w.waiting > 0 {
			c.cond.Broadcast()
		}
		if len(c.blocked) > 0 {
			c.resumeLocked()
		}
		c.mu.Unlock()
		if !more {
			return
		}
	} else {
		c.mu.Unlock()
	}
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Inline writes (Flush on a loop): at most inlineMax bytes, into a socket
// whose send queue (SIOCOUTQ: bytes not yet acknowledged, sent or not)
// holds at most inlineQueue bytes, so that the write does not wait for the
// client. A client that stops reading, or a path with many bytes in
// flight, sends the writes to the writer goroutine. The send buffer is at
// least tcp_wmem's default (16 KiB) and autotuned to about twice the
// initial congestion window's memory (≈ 40 KiB of skb memory) from the
// connection's start; 16 KiB of TLS records cost ≈ 26 KiB of it at a
// 1,448-byte MSS, which fits beside 4 KiB queued. (A first version checked
// only the unsent bytes, SIOCOUTQNSD, and allowed 32 KiB: with a full
// congestion window in flight such a write could wait a round trip on the
// loop, and every stream of the loop with it.)
const (
	inlineMax   = 16 << 10
	inlineQueue = 4 << 10
)

// roomFor reports whether n bytes of frames (a little more once
// encrypted) go to the socket at once: its queued bytes (SIOCOUTQ, a raw
// ioctl) are few.
func (c *h2conn) roomFor(n int) bool {
	if c.raw == nil || n > inlineMax {
		return false
	}
	q := -1
	c.raw.Control(func(fd uintptr) {
		var v int32
		if _, _, e := unix.RawSyscall(unix.SYS_IOCTL, fd, unix.SIOCOUTQ, uintptr(unsafe.Pointer(&v))); e == 0 {
			q = int(v)
		}
	})
	return q >= 0 && q <= inlineQueue
}

// Close is evloop.ClientSink's: END_STREAM (on the trailer's HEADERS, or
// an empty DATA frame) or, with reset, RST_STREAM CANCEL; then the stream
// leaves the connection. The loop's Flush writes it.
func (s *H2LoopStream) Close(reset bool) {
	st := s.st
	c := st.c
	c.mu.Lock()
	if st.retired {
		c.mu.Unlock()
		return
	}
	if !st.reset && !c.closed && c.w.err == nil {
		switch {
		case reset:
			c.w.fr.WriteRSTStream(st.id, http2.ErrCodeCancel)
			st.reset = true
		case st.ltrailer != nil:
			c.w.hbuf.Reset()
			for _, f := range st.ltrailer {
				c.w.enc.WriteField(f)
			}
			c.headerBlockLocked(st.id, true)
		default:
			c.w.data(st.id, nil, true)
		}
		st.ended = true
		if !reset && !st.remoteEnded {
			// The response is complete; the client need not send the rest.
			c.w.fr.WriteRSTStream(st.id, http2.ErrCodeNo)
		}
	}
	st.waker = nil
	st.retireLocked()
	if c.unackedConn >= int64(c.lim.connWindow/2) {
		c.w.fr.WriteWindowUpdate(0, uint32(c.unackedConn))
		c.recvConn += c.unackedConn
		c.unackedConn = 0
	}
	c.mu.Unlock()
	st.cancel(nil)
}

// rawOf is the socket under a connection of the server (through the
// listeners' wrappers, which expose it), for roomFor; nil when none.
func rawOf(nc any) syscall.RawConn {
	if u, ok := nc.(interface{ NetConn() net.Conn }); ok {
		nc = u.NetConn()
	}
	if hc, ok := nc.(*handshakenConn); ok {
		nc = hc.Conn
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return raw
}

// unblockLocked takes st out of c.blocked.
func (c *h2conn) unblockLocked(st *h2stream) {
	st.blocked = false
	for i, b := range c.blocked {
		if b == st {
			last := len(c.blocked) - 1
			c.blocked[i] = c.blocked[last]
			c.blocked[last] = nil
			c.blocked = c.blocked[:last]
			return
		}
	}
}

// resumeLocked resumes the streams in c.blocked that have credit again,
// when the buffer has room.
func (c *h2conn) resumeLocked() {
	if len(c.blocked) == 0 || c.sendConn <= 0 || len(c.w.buf) >= maxBuffered {
		return
	}
	keep := c.blocked[:0]
	for _, st := range c.blocked {
		switch {
		case st.sendWin > 0 && st.waker != nil:
			st.blocked = false
			st.waker.Resume()
		case st.reset || st.retired:
			st.blocked = false
		default:
			keep = append(keep, st)
		}
	}
	clear(c.blocked[len(keep):])
	c.blocked = keep
}

// writeLoop is the connection's writer for the loops' frames: woken once
// per loop batch (Flush), it writes the buffer as any writer does. It
// ends with the connection (abort closes quit).
func (c *h2conn) writeLoop() {
	for {
		select {
		case <-c.kick:
		case <-c.quit:
			return
		}
		c.mu.Lock()
		c.flushLocked()
		c.mu.Unlock()
	}
}
