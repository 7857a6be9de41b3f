package h1up

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/sluice-proxy/sluice/internal/chunked"
)

// How a response body is delimited.
const (
	modeNone    uint8 = iota // no body (HEAD, 1xx, 204, 304, Content-Length: 0)
	modeLength               // Content-Length
	modeChunked              // Transfer-Encoding: chunked
	modeClose                // up to the connection's close
)

// Body states.
const (
	stOpen     uint8 = iota
	stReading        // a Read is in flight (Close then only closes the socket)
	stEOF            // read to its end; the connection went back to the pool or was closed
	stClosed         // closed by Close, or failed
	stDetached       // taken over by Detach
)

// Body is a response body read straight off its connection. Read and
// Detach must not be called concurrently with each other; Close may be
// called at any time from any goroutine (it then ends a Read in flight).
type Body struct {
	t    *Transport
	c    *conn
	nc   net.Conn // c.nc: what the cancel callback closes (changed only with the callback stopped)
	ctx  context.Context
	cc   ConnCanceler // ctx, when it closes nc itself
	stop func() bool  // stops the context.AfterFunc that closes nc (cc nil)

	w reqWriter // writes the request, takes c (attach)

	mode      uint8
	keep      bool  // the connection may serve another request after the body
	remaining int64 // modeLength: body bytes not yet returned by Read
	dec       chunked.Decoder

	mu    sync.Mutex
	state uint8
	err   error // why the body ended early, returned by later Reads

	key string // after Detach: the detached connection's pool key
	gen uint64 // after Detach: the transport's generation then (Return)
}

var _ io.ReadCloser = (*Body)(nil)

// ConnCanceler is a request context that closes the exchange's
// connection itself when it is cancelled. On such a context the Transport
// registers no context.AfterFunc (a lock-taking registration and six
// allocations per request): it hands the connection over with HoldConn
// while the exchange holds it and takes it back with ReleaseConn. The
// proxy's attempt context is one: its leg cancels it directly.
type ConnCanceler interface {
	context.Context
	// HoldConn makes nc the connection a cancel closes from now on; on a
	// context already cancelled it closes nc at once.
	HoldConn(nc io.Closer)
	// ReleaseConn ends HoldConn. It reports false when a cancel closed
	// the connection or is closing it (as context.AfterFunc's stop).
	ReleaseConn() bool
	// Cause is what context.Cause would report for the context.
	Cause() error
}

// Waiter is a request context told when the exchange has written its
// request whole and is about to wait for the answer's head: the window in
// which the backend works on the request and the caller's goroutine would
// only wait, where a proxy can do what its answer's first bytes need but
// the backend does not (a socket query, say). Waiting runs on the
// goroutine that called RoundTrip, once per request written (a retry on a
// fresh connection calls it again); on Linux with SLUICE_H1UP_SENDWAIT the
// wait is part of the write and Waiting comes after it.
type Waiter interface {
	context.Context
	Waiting()
}

// causeOf is context.Cause of ctx, or its own for a ConnCanceler.
func causeOf(ctx context.Context) error {
	if cc, ok := ctx.(ConnCanceler); ok {
		return cc.Cause()
	}
	return context.Cause(ctx)
}

// attach makes c the exchange's connection: a cancel of the request's
// context closes it from now on.
func (b *Body) attach(c *conn) {
	b.c, b.nc = c, c.nc
	if b.cc != nil {
		b.cc.HoldConn(c.nc)
		return
	}
	b.stop = context.AfterFunc(b.ctx, b.cancel)
}

// unwatch ends attach's watch: false when the context's cancel closed
// (or is closing) the connection.
func (b *Body) unwatch() bool {
	if b.cc != nil {
		return b.cc.ReleaseConn()
	}
	return b.stop()
}

// cancel runs when the request's context is done before the body ended:
// it closes the socket, which ends any Read or write in flight.
func (b *Body) cancel() { b.nc.Close() }

// Read reads the body's payload (decoded when chunked). It returns io.EOF
// at the end of the body, together with the last bytes when it can; the
// connection is released at that moment. After the request's context is
// done it returns the context's cause.
func (b *Body) Read(p []byte) (int, error) {
	b.mu.Lock()
	switch b.state {
	case stEOF:
		b.mu.Unlock()
		return 0, io.EOF
	case stClosed:
		err := b.err
		b.mu.Unlock()
		return 0, err
	case stDetached:
		b.mu.Unlock()
		return 0, ErrDetached
	}
	b.state = stReading
	b.mu.Unlock()

	n, done, err := b.read(p)

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state != stReading { // closed meanwhile: Close closed the socket
		b.release(false)
		return n, b.err
	}
	switch {
	case err != nil:
		if b.ctx.Err() != nil {
			err = causeOf(b.ctx)
		}
		b.state, b.err = stClosed, err
		b.release(false)
		return n, err
	case done:
		b.state = stEOF
		b.release(b.keep)
		return n, io.EOF
	}
	b.state = stOpen
	if br := b.c.br; br != nil && br.Buffered() == 0 {
		// Nothing buffered: the reader goes back to its pool until the
		// next Read, so a stream waiting for its next event holds none.
		br.Reset(nil)
		b.t.readers.Put(br)
		b.c.br = nil
	}
	return n, nil
}

// read reads from the connection by the body's framing. done reports the
// end of the body.
func (b *Body) read(p []byte) (n int, done bool, err error) {
	if len(p) == 0 {
		return 0, false, nil
	}
	br := b.c.br
	if br == nil {
		br = b.t.readers.Get().(*bufio.Reader)
		br.Reset(b.c.reader())
		b.c.br = br
	}
	switch b.mode {
	case modeNone:
		return 0, true, nil
	case modeLength:
		if int64(len(p)) > b.remaining {
			p = p[:b.remaining]
		}
		n, err = br.Read(p)
		b.remaining -= int64(n)
		if b.remaining == 0 {
			return n, true, nil
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return n, false, err
	case modeChunked:
		for {
			if br.Buffered() == 0 {
				if _, err := br.Peek(1); err != nil {
					if err == io.EOF {
						err = io.ErrUnexpectedEOF
					}
					return 0, false, err
				}
			}
			src, _ := br.Peek(min(br.Buffered(), len(p)))
			// The payload never runs ahead of the input, so it fits in p.
			out, used, fin, derr := b.dec.Decode(p[:0], src)
			br.Discard(used)
			if derr != nil {
				return 0, false, errors.Join(ErrMalformedResponse, derr)
			}
			if len(out) > 0 || fin {
				return len(out), fin, nil
			}
		}
	default: // modeClose
		n, err = br.Read(p)
		if err == io.EOF {
			return n, true, nil
		}
		return n, false, err
	}
}

// Close ends the body. A body not read to its end closes its connection,
// unless the rest of a Content-Length body is already buffered. Close
// after Detach does nothing.
func (b *Body) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case stReading:
		b.state, b.err = stClosed, ErrBodyClosed
		b.nc.Close() // ends the Read, which then releases the rest
		return nil
	case stOpen:
		b.state, b.err = stClosed, ErrBodyClosed
		buffered := 0
		if b.c.br != nil {
			buffered = b.c.br.Buffered()
		}
		keep := b.keep && b.mode == modeLength && b.remaining <= int64(buffered)
		if keep {
			b.c.br.Discard(int(b.remaining))
			b.remaining = 0
		}
		b.release(keep)
	}
	return nil
}

// finish ends a body that has none (called by RoundTrip).
func (b *Body) finish() {
	b.state = stEOF
	b.release(b.keep)
}

// abort closes the connection of an exchange that failed before a
// response was returned.
func (b *Body) abort() {
	b.state, b.err = stClosed, ErrBodyClosed
	b.release(false)
}

// release stops the cancel callback and returns the connection to the
// pool when keep is set and nothing is left over, else closes it.
func (b *Body) release(keep bool) {
	c := b.c
	if c == nil {
		return
	}
	b.c = nil
	if !b.unwatch() { // the context is done: cancel closes (or closed) the socket
		keep = false
	}
	if keep && (c.br == nil || c.br.Buffered() == 0) {
		b.t.putIdle(c)
		return
	}
	c.nc.Close()
	if c.br != nil {
		c.br.Reset(nil)
		b.t.readers.Put(c.br)
		c.br = nil
	}
}

// Detach takes the connection over: after it the Transport forgets conn
// (never reuses it), Read returns ErrDetached and Close does nothing;
// context cancellation no longer touches conn. raw holds the bytes already
// read from conn that Read has not returned yet, still in wire framing
// (a copy: the reader goes back to its pool). dec is a copy of the
// chunked decoder's state when the body is chunked (continue decoding raw
// and further reads with it), nil otherwise. remaining is the bytes left
// of a Content-Length body (counting raw), -1 for a body delimited by the
// connection's close, 0 when chunked. Detach fails when the body already
// ended, was closed, or the request's context is done.
func (b *Body) Detach() (conn net.Conn, raw []byte, dec *chunked.Decoder, remaining int64, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case stDetached:
		return nil, nil, nil, 0, ErrDetached
	case stEOF:
		return nil, nil, nil, 0, errors.New("h1up: detach after the body ended")
	case stClosed:
		return nil, nil, nil, 0, b.err
	case stReading:
		return nil, nil, nil, 0, errors.New("h1up: detach during a read")
	}
	if !b.unwatch() { // the cancel callback ran or runs: conn is being closed
		b.state, b.err = stClosed, causeOf(b.ctx)
		b.c = nil
		return nil, nil, nil, 0, b.err
	}
	c := b.c
	b.c, b.state = nil, stDetached
	b.key = c.key
	b.t.mu.Lock()
	b.gen = b.t.gen
	b.t.mu.Unlock()
	if b.t.o.SpareOnDetach {
		b.t.spare(c.key) // c never comes back to the pool
	}
	if br := c.br; br != nil {
		if k := br.Buffered(); k > 0 {
			raw = make([]byte, k)
			br.Read(raw)
		}
		br.Reset(nil)
		b.t.readers.Put(br)
		c.br = nil
	}
	switch b.mode {
	case modeChunked:
		d := b.dec
		dec = &d
	case modeLength:
		remaining = b.remaining
	case modeClose:
		remaining = -1
	}
	return c.nc, raw, dec, remaining, nil
}

// Reusable reports whether the connection Detach took over may serve
// another request once its body has been read to its end: the response
// did not ask to close it and its body is delimited (not read to EOF).
func (b *Body) Reusable() bool {
	return b.keep && (b.mode == modeChunked || b.mode == modeLength)
}

// Return gives back the connection Detach took over (nc is that socket,
// possibly under a new net.Conn, such as one net.FileConn made) once its
// body was read to its end and nothing past it: nc goes to the
// transport's idle pool for its host, as a body read by Read does. It is
// closed instead, and false returned, when the body was not detached, the
// connection is not reusable, or CloseIdleConnections ran since Detach.
// The pool's bound, idle timeout and liveness check on reuse apply.
func (b *Body) Return(nc net.Conn) bool {
	b.mu.Lock()
	ok := b.state == stDetached && b.Reusable()
	b.state = stClosed
	if b.err == nil {
		b.err = ErrDetached
	}
	b.mu.Unlock()
	if !ok {
		nc.Close()
		return false
	}
	c := &conn{nc: nc, key: b.key, idleAt: time.Now()}
	c.initProbe()
	t := b.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.gen != b.gen {
		nc.Close()
		return false
	}
	t.parkLocked(c)
	return true
}
