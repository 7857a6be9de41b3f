package listen

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"
)

// prepListener accepts connections and prepares each one in its own
// goroutine before Accept hands it on: the TLS handshake (tlsListener), the
// PROXY protocol header (proxyListener). A slow client holds up no other,
// and Close aborts the preparations in progress (each watches ctx) and
// waits for their goroutines.
type prepListener struct {
	inner net.Listener
	// admit, when set, is asked first about each accepted connection;
	// false closes it at once, before a byte is read.
	admit func(net.Conn) bool
	// prepare returns the connection to hand on, or nil when it closed c.
	prepare func(c net.Conn, accepted time.Time) net.Conn

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	conns  chan net.Conn
	errs   chan error
	once   sync.Once
	loop   sync.WaitGroup // the accept loop and the preparations
}

// start begins accepting; admit and prepare must be set before.
func (l *prepListener) start(inner net.Listener) {
	l.inner = inner
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.conns, l.errs = make(chan net.Conn), make(chan error)
	l.loop.Add(1)
	go l.acceptLoop()
}

// Accept returns the next prepared connection.
func (l *prepListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case err := <-l.errs:
		return nil, err
	case <-l.ctx.Done():
		return nil, net.ErrClosed
	}
}

// Close stops accepting and aborts the preparations in progress.
// Connections already returned by Accept are not affected.
func (l *prepListener) Close() error {
	var err error
	l.once.Do(func() {
		l.cancel()
		err = l.inner.Close()
		l.loop.Wait()
	})
	return err
}

func (l *prepListener) Addr() net.Addr { return l.inner.Addr() }

// acceptLoop accepts connections until the listener is closed. Accept
// errors are passed to the server (which backs off on temporary ones).
func (l *prepListener) acceptLoop() {
	defer l.loop.Done()
	for {
		c, err := l.inner.Accept()
		if err != nil {
			select {
			case l.errs <- err:
			case <-l.ctx.Done():
				return
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if l.admit != nil && !l.admit(c) {
			c.Close()
			continue
		}
		l.loop.Add(1)
		go l.run(c, time.Now())
	}
}

// run prepares c and queues it for Accept.
func (l *prepListener) run(c net.Conn, accepted time.Time) {
	defer l.loop.Done()
	pc := l.prepare(c, accepted)
	if pc == nil {
		return
	}
	select {
	case l.conns <- pc:
	case <-l.ctx.Done():
		pc.Close()
	}
}
