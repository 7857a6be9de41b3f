package listen

import (
	"bytes"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2writer is a connection's write side, guarded by the connection's
// mutex: the frames not yet written, and who writes them.
type h2writer struct {
	buf, spare []byte
	// flushing: a goroutine is writing a taken buffer to the socket; it
	// writes what was added meanwhile before it lets go.
	flushing bool
	started  uint64 // socket writes begun
	waiting  int    // goroutines waiting on the connection's cond
	err      error  // the first write error: the connection is dead
	fr       *http2.Framer
	enc      *hpack.Encoder
	hbuf     bytes.Buffer
	lower    map[string]string // canonical header key -> lower case
}

// maxSpare is the largest buffer kept for reuse; maxBuffered is the
// buffered bytes past which a stream waits for the write under way
// rather than adding more.
const (
	maxSpare    = 64 << 10
	maxBuffered = 256 << 10
)

func (w *h2writer) init(c *h2conn) {
	w.fr = http2.NewFramer(w, nil)
	w.enc = hpack.NewEncoder(&w.hbuf)
	w.lower = map[string]string{}
}

// Write adds a frame (the Framer's output) to the buffer.
func (w *h2writer) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	return len(p), nil
}

// data adds a DATA frame.
func (w *h2writer) data(id uint32, p []byte, end bool) {
	var flags byte
	if end {
		flags = byte(http2.FlagDataEndStream)
	}
	n := len(p)
	w.buf = append(w.buf, byte(n>>16), byte(n>>8), byte(n), byte(http2.FrameData), flags,
		byte(id>>24)&0x7f, byte(id>>16), byte(id>>8), byte(id))
	w.buf = append(w.buf, p...)
}

// flushLocked writes the buffer to the socket unless another goroutine's
// write is under way (that one writes these frames when its write
// returns). It is called with c.mu held, releases it during the write and
// holds it again on return.
func (c *h2conn) flushLocked() error {
	w := &c.w
	if w.flushing {
		return w.err
	}
	for len(w.buf) > 0 && w.err == nil {
		c.writeBufLocked()
	}
	if w.waiting > 0 {
		c.cond.Broadcast()
	}
	if len(c.blocked) > 0 {
		c.resumeLocked()
	}
	return w.err
}

// writeBufLocked takes the buffer and writes it once, without c.mu (held
// on entry and on return), as the connection's one writer; the frames added
// meanwhile wait in the new buffer for the caller's next write.
func (c *h2conn) writeBufLocked() {
	w := &c.w
	b := w.buf
	w.buf = w.spare[:0]
	w.flushing = true
	w.started++
	c.mu.Unlock()
	_, err := c.nc.Write(b)
	c.mu.Lock()
	c.wroteLocked(b, err)
}

// wroteLocked ends a socket write of b (taken from w.buf) that returned
// err.
func (c *h2conn) wroteLocked(b []byte, err error) {
	w := &c.w
	w.flushing = false
	if cap(b) <= maxSpare {
		w.spare = b[:0]
	} else {
		w.spare = nil
	}
	if err != nil {
		w.err = err
		w.buf = w.buf[:0]
		c.nc.Close() // the reader ends the connection
	}
}

// armStallLocked starts the write-stall watchdog while streams run.
func (c *h2conn) armStallLocked() {
	if c.lim.writeStall <= 0 {
		return
	}
	if c.stallTimer == nil {
		c.stallTimer = time.AfterFunc(c.lim.writeStall, c.checkStall)
		return
	}
	c.stallTimer.Reset(c.lim.writeStall)
}

// checkStall closes the connection when one socket write has lasted a
// whole watchdog period (the client stopped reading); the reader then
// cancels every stream.
func (c *h2conn) checkStall() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	if c.w.flushing && c.w.started == c.stallSeq {
		c.nc.Close()
		return
	}
	c.stallSeq = c.w.started
	if len(c.streams) > 0 {
		c.stallTimer.Reset(c.lim.writeStall)
	}
}

// headerBlockLocked adds a header block (encoded in w.hbuf) as HEADERS
// and CONTINUATION frames of the client's maximum frame size.
func (c *h2conn) headerBlockLocked(id uint32, end bool) {
	b := c.w.hbuf.Bytes()
	n := min(len(b), c.maxFrame)
	c.w.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: b[:n], EndStream: end, EndHeaders: n == len(b)})
	for b = b[n:]; len(b) > 0; b = b[n:] {
		n = min(len(b), c.maxFrame)
		c.w.fr.WriteContinuation(id, n == len(b), b[:n])
	}
}

// field encodes one header field into w.hbuf.
func (w *h2writer) field(name, value string) {
	w.enc.WriteField(hpack.HeaderField{Name: name, Value: value})
}

// lowerKey is the wire name of a header key (kept per connection: a
// response's keys repeat).
func (w *h2writer) lowerKey(k string) string {
	if v, ok := w.lower[k]; ok {
		return v
	}
	v := strings.ToLower(k)
	if len(w.lower) < 128 {
		w.lower[k] = v
	}
	return v
}

// connHeaders are never sent on HTTP/2 (RFC 9113, 8.2.2).
var connHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Transfer-Encoding": true, "Upgrade": true,
}

// headerFields encodes a header map's fields, skipping trailer
// declarations of the TrailerPrefix form and connection headers.
func (w *h2writer) headerFields(h map[string][]string) {
	for k, vv := range h {
		if connHeaders[k] || strings.HasPrefix(k, "Trailer:") || !httpguts.ValidHeaderFieldName(k) {
			continue
		}
		lk := w.lowerKey(k)
		for _, v := range vv {
			if httpguts.ValidHeaderFieldValue(v) {
				w.field(lk, v)
			}
		}
	}
}
