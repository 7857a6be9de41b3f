// Package netdelay is a real TCP relay on a loopback port that adds a fixed
// delay to every byte in each direction and can cut the link on demand: the
// test stand-in for the wide-area path between an edge region and a remote
// store (80–250 ms between regions). Bytes keep their order and the relay
// keeps the link's throughput (a chunk is delayed, not the reading).
package netdelay

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Relay forwards connections accepted on Addr to a target address, each
// direction delayed by Delay. Close stops it and every connection.
type Relay struct {
	ln     net.Listener
	target string
	delay  atomic.Int64 // ns, one way

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
	done  chan struct{}
}

// Start listens on 127.0.0.1 (a free port) and relays to target with a
// one-way delay.
func Start(target string, delay time.Duration) (*Relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Relay{ln: ln, target: target, conns: make(map[net.Conn]struct{}), done: make(chan struct{})}
	r.delay.Store(int64(delay))
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

// Addr is the relay's host:port.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// SetDelay changes the one-way delay of bytes read from now on.
func (r *Relay) SetDelay(d time.Duration) { r.delay.Store(int64(d)) }

// Partition cuts the link (true): every open connection is closed and new
// ones are closed as soon as they are accepted, so a client sees resets and
// failed handshakes as on a broken path. Partition(false) heals it.
func (r *Relay) Partition(cut bool) {
	r.mu.Lock()
	r.cut = cut
	var open []net.Conn
	if cut {
		for c := range r.conns {
			open = append(open, c)
		}
	}
	r.mu.Unlock()
	for _, c := range open {
		c.Close()
	}
}

// Close stops accepting, closes every connection and waits for the relay's
// goroutines to end.
func (r *Relay) Close() error {
	err := r.ln.Close()
	r.mu.Lock()
	select {
	case <-r.done:
	default:
		close(r.done)
	}
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
	return err
}

// add registers c unless the link is cut or the relay closed.
func (r *Relay) add(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.done:
		return false
	default:
	}
	if r.cut {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *Relay) remove(cs ...net.Conn) {
	r.mu.Lock()
	for _, c := range cs {
		delete(r.conns, c)
		c.Close()
	}
	r.mu.Unlock()
}

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		if !r.add(c) {
			c.Close()
			continue
		}
		r.wg.Add(1)
		go r.serve(c)
	}
}

// serve dials the target and pipes both directions until either ends.
func (r *Relay) serve(c net.Conn) {
	defer r.wg.Done()
	up, err := net.DialTimeout("tcp", r.target, 5*time.Second)
	if err != nil {
		r.remove(c)
		return
	}
	if !r.add(up) {
		up.Close()
		r.remove(c)
		return
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); r.pipe(up, c); r.remove(c, up) }()
	go func() { defer wg.Done(); r.pipe(c, up); r.remove(c, up) }()
	wg.Wait()
}

type chunk struct {
	b  []byte
	at time.Time
}

// pipe copies src to dst, each chunk written Delay after it was read.
func (r *Relay) pipe(dst, src net.Conn) {
	q := make(chan chunk, 1024)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ch := range q {
			if d := time.Until(ch.at); d > 0 {
				select {
				case <-time.After(d):
				case <-r.done:
					return
				}
			}
			if _, err := dst.Write(ch.b); err != nil {
				src.Close() // unblock the reader
				for range q {
				}
				return
			}
		}
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			b := append([]byte(nil), buf[:n]...)
			select {
			case q <- chunk{b: b, at: time.Now().Add(time.Duration(r.delay.Load()))}:
			case <-r.done:
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				dst.Close()
			}
			break
		}
	}
	close(q)
	wg.Wait()
}
