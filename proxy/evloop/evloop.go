// Package evloop relays committed HTTP/1.1 event streams without a
// goroutine per stream: a few loops (one fewer than GOMAXPROCS, at least
// one: DefaultLoops), each one goroutine waiting for its epoll descriptor
// in Go's netpoller, own the client's and the backend's sockets once the
// response head and the first event have been sent. Per wake-up and
// stream a loop reads what the backend sent into a buffer shared by the
// loop, decodes the chunked coding in place, splits the payload into SSE
// events, hands each to the stream's Relay (which appends what the client
// gets to the loop's out buffer) and writes all of it to the client in one
// write(2). An idle stream holds no buffer: only a partial event (rare) or
// bytes the client has not taken yet are kept per stream, in pooled
// buffers.
//
// The sockets stay under their net.Conns in Go's netpoller (where no
// goroutine waits on them while a loop has them); their own descriptors
// are registered in the loop's epoll set too, edge-triggered, once: no
// epoll_ctl per event. The client's socket with EPOLLIN|EPOLLOUT|EPOLLRDHUP
// (EPOLLOUT only fires after a write was cut short, when the socket drains
// again), the backend's, which the loop only reads, with EPOLLIN|EPOLLRDHUP.
package evloop

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sluice-proxy/sluice/internal/chunked"
)

// Why a stream ended, as passed to Relay.End and Relay.Closed.
var (
	// ErrClientGone: the client closed or reset its connection, or
	// half-closed it (net/http cancels a request on that too).
	ErrClientGone = errors.New("evloop: client went away")
	// ErrUpstreamCut: the backend's body ended (EOF, or its framing's end)
	// before the Relay said the stream was done.
	ErrUpstreamCut = errors.New("evloop: upstream stream ended early")
	// ErrIdle: the backend sent nothing for the stream's idle timeout.
	ErrIdle = errors.New("evloop: upstream stream idle")
	// ErrSlowClient: the client left more than MaxPending bytes unread,
	// or took none of them for the idle timeout.
	ErrSlowClient = errors.New("evloop: client too slow")
	// ErrEventTooLarge: one event grew past MaxEventBytes.
	ErrEventTooLarge = errors.New("evloop: event too large")
	// ErrClosed: the loop was closed under the stream.
	ErrClosed = errors.New("evloop: loop closed")
	// ErrFailed: the loop failed under the stream (its epoll_wait failed,
	// see Group.Err), or, from Add, every loop has failed. The errors
	// carrying it also carry the wait's error.
	ErrFailed = errors.New("evloop: loop failed")
)

// Relay is a stream's per-event work. The loop calls it from its own
// goroutine only, one call at a time; none of its methods may block.
type Relay interface {
	// Event handles one complete SSE event (its lines through the blank
	// line that ends it) and appends what the client gets to out, in the
	// client's framing (chunked). done ends the stream: the loop stops
	// reading the backend and calls End(out, nil). ev and out belong to
	// the loop and are valid only during the call.
	Event(out, ev []byte, now time.Time) (_ []byte, done bool)
	// End appends the stream's last bytes to out (the timing comment, the
	// error event, the last chunk and trailer). err is nil when Event said
	// done, else why the stream ended (one of this package's errors, a
	// read or decode error, or the cause given to EndAll or Handle.End).
	// For ErrClientGone and ErrSlowClient the bytes are not written. The
	// backend's socket is closed before End (or, see Stream.Reuse, given
	// back or still read to its body's end). hold keeps the client's
	// socket open after out is written, until Handle.Finish gives the
	// stream's tail (work that may wait, such as a settle, comes between).
	End(out []byte, err error) (_ []byte, hold bool)
	// Closed reports that the client's socket is closed (or kept) and
	// the stream left the loop, its backend's socket closed or (Reuse)
	// still read to its body's end; sent is the bytes written to the client. It runs on the loop:
	// anything that may wait (settle, logs) goes to another goroutine. A
	// held stream is closed after its Finish, or when the loop stops.
	Closed(err error, sent int64)
}

// ClientSink is a stream's client side when it is not a socket of the
// loop's own: an HTTP/2 stream on its client connection (proxy/listen),
// which the loop frames its bytes into. Every method runs on the loop and
// must not block.
type ClientSink interface {
	// Attach is called once, when the loop starts the stream: the sink
	// calls w.Resume when it can take bytes again after a Write that took
	// less than it was given (flow control, a full connection buffer),
	// and w.Gone when the client left (a reset, the connection's end);
	// both queue a command for the loop and never block. A client that
	// left before Attach is reported by calling w.Gone from Attach.
	Attach(w Waker)
	// Write takes what it can of p for the client (within the stream's
	// and the connection's windows and buffer bound) and reports how
	// much; the rest is offered again after a Resume. An error means the
	// client is gone.
	Write(p []byte) (n int, err error)
	// Flush starts the write of what Writes buffered, without waiting.
	// The loop calls it once per batch for each sink written in it.
	Flush()
	// Close ends the client's side at the stream's end (after its last
	// bytes were taken): cleanly, or with a reset when the client is gone
	// or bytes could not be delivered.
	Close(reset bool)
}

// Waker reaches a stream on its loop from another goroutine (a Handle).
type Waker interface {
	// Resume makes the loop offer the stream's pending bytes to its sink
	// again and, once they are taken, read its backend again.
	Resume()
	// Gone ends the stream as if its client's socket had closed.
	Gone()
}

// Stream is what Add hands to a loop.
type Stream struct {
	// Client and Upstream are the connections; each must be a
	// syscall.Conn (a *net.TCPConn). They stay in Go's netpoller (where
	// no goroutine waits on them while the loop has them): the loop uses
	// their own descriptors, registered in its epoll set beside the
	// netpoller's, and closes a socket with its net.Conn's Close.
	// Keeper.Keep and Reuse take over the net.Conn itself (their fd is
	// its descriptor, out of the loop's epoll set and still open), with
	// nothing to rebuild: a socket's way in and out of the loop costs two
	// epoll_ctl. Nothing else may close either connection while the loop
	// has it. With Sink, Client is nil: the client side is Sink.
	Client, Upstream net.Conn
	// Sink, when set, is the client's side instead of Client's socket
	// (an HTTP/2 stream): the loop gives it what the Relay produced and
	// pauses the backend's reads while it takes less. KeepInput and
	// Keeper do not apply.
	Sink ClientSink
	// Out is written to the client first (the response head and the
	// first event, say), without blocking: what the socket does not take
	// waits as any other pending bytes. Add takes a copy.
	Out []byte
	// Pending is payload already decoded from Upstream but not yet split
	// into events (it comes before Raw).
	Pending []byte
	// Raw is bytes already read from Upstream, not yet decoded.
	Raw []byte
	// Decoder is the chunked state of the body; nil when it is not
	// chunked: then Remaining is the Content-Length bytes left, or -1
	// when the body ends at EOF. Add takes a copy.
	Decoder   *chunked.Decoder
	Remaining int64
	// Idle ends the stream (ErrIdle) when the backend sends nothing for
	// that long; 0 means never. It also bounds how long a client may
	// leave bytes unread (ErrSlowClient).
	Idle  time.Duration
	Relay Relay
	// Reuse, when set, takes the backend's socket back instead of the
	// loop closing it, when the stream completed (the Relay's Event said
	// done) and the backend's body ended cleanly: the chunked coding's
	// last chunk and trailer, or all Content-Length bytes, were read,
	// with nothing after them, and the backend did not half-close. A body
	// not yet at its end when the Relay is done is read on (and dropped),
	// after the stream's client side has finished too, for a second at
	// most (drainGrace; then the socket is closed). fd is Upstream's
	// descriptor, no longer in the loop's epoll set; Reuse owns Upstream
	// from then on. It runs on the loop and must not block. Every other
	// end closes the socket.
	Reuse func(fd int)
	// KeepInput leaves what the client sends during the stream unread
	// (its next, pipelined request) for whoever gets the socket after
	// it: a Relay that is a Keeper. The client's close is still seen
	// (EPOLLRDHUP). When the socket is closed instead, its input is read
	// and dropped first (a close over unread input resets the connection).
	KeepInput bool
}

// Keeper is a Relay that may take the client's socket over when its
// stream ended cleanly: Event said done (End got a nil error), the last
// bytes were all written, and the client is still there. Keep runs on the
// loop, after the socket left the loop's epoll set, and before Closed; it
// reports whether it took fd, the Stream's Client's descriptor (taking it
// means taking Client over; else the loop closes it). It must not block.
type Keeper interface {
	Keep(fd int) bool
}

// Options configures a Group.
type Options struct {
	// Loops is the number of loops (goroutines); 0 means DefaultLoops
	// (GOMAXPROCS - 1, at least one).
	Loops int
	// MaxPending bounds the bytes a stream may hold for a client that
	// reads slowly; past it the stream is cut (ErrSlowClient). 0 means
	// 1 MiB.
	MaxPending int
	// Sweep is how often idle deadlines are checked; 0 means 250ms.
	// An idle stream is ended between Idle and Idle+Sweep after its last
	// byte.
	Sweep time.Duration
	// ReadBuffer is the size of each loop's read buffer; 0 means 64 KiB.
	ReadBuffer int
	// NoHelp makes Help do nothing (see Group.Help): for measuring what
	// Help costs and gives.
	NoHelp bool
}

// MaxEventBytes bounds one event (as proxy.MaxEventBytes does).
const MaxEventBytes = 1 << 20

// helpAfter is how long a loop may go without an epoll_wait before
// Group.Help serves it on another goroutine.
const helpAfter = int64(200 * time.Microsecond)

// epoch is the origin of mono.
var epoch = time.Now()

// mono is a monotonic clock reading in nanoseconds.
func mono() int64 { return int64(time.Since(epoch)) }

// Group is a set of loops; streams are assigned round robin.
type Group struct {
	help  bool // Help serves loops (the netpoller's wait, the default)
	loops []*loop
	next  atomic.Uint32
	wg    sync.WaitGroup
	live  atomic.Int64
	once  sync.Once
	err   atomic.Pointer[error] // the first loop failure (loop.fail)
	// closing is set by Close before it stops the loops: Add then
	// refuses with ErrClosed, not with the failure of a loop.
	closing atomic.Bool
}

// failed records a loop's failure (the first one is kept for Err).
func (g *Group) failed(err error) { g.err.CompareAndSwap(nil, &err) }

// Err is the first error a loop failed with (its epoll_wait returned an
// errno other than EINTR; its streams were ended with that error and it
// takes no more), or nil while every loop runs. It wraps ErrFailed and the
// wait's error.
func (g *Group) Err() error {
	if p := g.err.Load(); p != nil {
		return *p
	}
	return nil
}

// New starts a group of loops.
func New(opts Options) (*Group, error) {
	g, err := build(opts)
	if err != nil {
		return nil, err
	}
	for _, l := range g.loops {
		g.wg.Add(1)
		go l.run()
	}
	return g, nil
}

// DefaultLoops is the number of loops a group starts for procs Ps
// (GOMAXPROCS) when Options.Loops is 0: one fewer than the Ps, at least
// one. Fewer loops relay more tokens per wake-up, and fewer loop
// goroutines ready at once wake fewer idle Ms (futex) to run them: on 2
// Ps, one loop instead of two cut Sluice's futex calls per token by three
// quarters and its CPU per token by 10-20 % on docs/benchmarks/run.sh
// target 1's shape (docs/BENCHMARKS.md, "h1cpu4"). Only 2 Ps were
// measured. The loops' own work (the backend's read, the client's write,
// the events' pipeline) was 60 % of Sluice's CPU per token there, so
// procs-1 loops can carry a node whose every P relays tokens from 3 Ps
// up; on 2 Ps the one loop could limit a node that saturates both cores
// with streaming (not reachable on the benchmark machine, whose
// simulator and clients share the cores).
func DefaultLoops(procs int) int { return max(1, procs-1) }

// LoopsEnv names the environment variable that sets Options.Loops when
// it is 0: an operator's override of DefaultLoops, which was measured on
// 2 Ps only (docs/BENCHMARKS.md, "h1cpu4"; docs/OPERATIONS.md).
const LoopsEnv = "SLUICE_LOOPS"

// fromEnv applies LoopsEnv to opts.
func fromEnv(opts Options) (Options, error) {
	if v := os.Getenv(LoopsEnv); v != "" && opts.Loops == 0 {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return opts, fmt.Errorf("evloop: %s=%q: want a number of loops", LoopsEnv, v)
		}
		opts.Loops = n
	}
	return opts, nil
}

// build makes a group whose loops' goroutines are not started.
func build(opts Options) (*Group, error) {
	opts, err := fromEnv(opts)
	if err != nil {
		return nil, err
	}
	if opts.Loops <= 0 {
		opts.Loops = DefaultLoops(runtimeProcs())
	}
	if opts.MaxPending <= 0 {
		opts.MaxPending = 1 << 20
	}
	if opts.Sweep <= 0 {
		opts.Sweep = 250 * time.Millisecond
	}
	if opts.ReadBuffer <= 0 {
		opts.ReadBuffer = 64 << 10
	}
	g := &Group{help: !opts.NoHelp}
	for range opts.Loops {
		l, err := newLoop(g, opts)
		if err != nil {
			g.Close()
			return nil, err
		}
		g.loops = append(g.loops, l)
	}
	return g, nil
}

// Help serves, on the calling goroutine, the ready sockets of every loop
// that nobody polled for helpAfter (200 µs) and nobody serves now: a
// loop's goroutine waits for its epoll descriptor in Go's netpoller, and
// while every P is busy (a wave of stream starts) the scheduler polls the
// network only when a run queue runs dry, or from sysmon every 10 ms, so
// a ready loop can go unnoticed for milliseconds. The request path calls
// Help at a few points (a request's start, a hand-off, a completion):
// the goroutines that keep the Ps busy then relay the sparse tokens
// themselves, as an nginx worker does between requests. It costs an
// atomic load per loop when the loops were polled lately, else one
// non-blocking epoll_wait; the loop's goroutine, woken later for events a
// helper took, finds none and waits again. The caller must hold nothing a
// Relay's methods take.
func (g *Group) Help() {
	if !g.help || g.live.Load() == 0 {
		return
	}
	now := mono()
	for _, l := range g.loops {
		l.help(now)
	}
}

// Streams is the number of streams the loops hold now.
func (g *Group) Streams() int64 { return g.live.Load() }

// Handle is a stream in its loop, for other goroutines.
type Handle struct {
	l *loop
	s *stream
}

// End ends the stream with err, as if its backend had failed with it (no
// effect when it is ending already). It does not wait.
func (h *Handle) End(err error) {
	h.l.command(func() {
		if !h.s.closed && !h.s.ending {
			h.l.end(h.s, err)
		}
	})
}

// Resume is Waker.Resume: the stream's sink can take bytes again.
func (h *Handle) Resume() {
	h.l.command(func() { h.l.resumeSink(h.s, time.Now()) })
}

// Gone is Waker.Gone: the stream's client left.
func (h *Handle) Gone() {
	h.l.command(func() {
		if !h.s.closed {
			h.l.gone(h.s)
		}
	})
}

// Finish ends a stream held by its Relay's End: tail is written, then the
// client's socket closes. It does not wait; tail must not change after.
func (h *Handle) Finish(tail []byte) {
	h.l.command(func() { h.l.release(h.s, tail) })
}

// Add hands s to a loop. On error the stream was not taken (Relay is not
// called) and s.Upstream is closed; so is s.Client, with one exception: a
// stream refused because no loop takes streams (ErrClosed: the group is
// closed; ErrFailed, with the first failure's cause: every loop failed)
// leaves s.Client open for the caller, who can still end the response (an
// error event), and s.Out holding what Add did not write of it. After any
// other error s.Client is nil.
func (g *Group) Add(s *Stream) (*Handle, error) {
	st := &stream{relay: s.Relay, keepIn: s.KeepInput, remaining: s.Remaining,
		idle: s.Idle, init: s.Pending, raw: s.Raw, reuse: s.Reuse, csink: s.Sink, cfd: -1}
	if s.Decoder != nil { // a copy in the stream: see stream
		st.decv = *s.Decoder
		st.dec = &st.decv
	}
	ufd, uerr := fdOf(s.Upstream)
	var cerr error
	if s.Sink != nil {
		st.keepIn = false
	} else {
		st.cfd, cerr = fdOf(s.Client)
	}
	if err := errors.Join(cerr, uerr); err != nil {
		if s.Client != nil {
			s.Client.Close()
		}
		s.Upstream.Close()
		s.Client = nil
		return nil, err
	}
	st.ufd, st.uconn = ufd, s.Upstream
	if s.Sink == nil {
		st.cconn = s.Client
	}
	cfd := st.cfd
	// Out (the head and the first token) is written here, on the caller's
	// goroutine, before the loop has the socket: the first token does not
	// wait for the loop to be woken and scheduled. What the socket does not
	// take (or an error, which the loop's own write then meets) is left
	// for the loop. The write is raw (raw.go) like the loop's own: as the
	// first system call of a stream's start after the process went idle,
	// unix.Write's entersyscall woke sysmon from its deep sleep right
	// before the first token's write (docs/BENCHMARKS.md, "start19").
	out := s.Out
	if len(out) > 0 && st.csink == nil {
		n, err := rawWrite(cfd, out)
		if err == nil && n > 0 {
			st.sent += int64(n)
			out = out[n:]
		}
	}
	if len(out) > 0 {
		st.pendp = getBuf()
		st.first = append(*st.pendp, out...)
	}
	if st.dec != nil {
		st.remaining = 0
	}
	g.live.Add(1)
	// Round robin; a loop that refuses (it failed, see loop.fail) passes
	// its turn to the next. All refuse once the group is closed.
	i := int(g.next.Add(1))
	for range g.loops {
		l := g.loops[i%len(g.loops)]
		if l.submit(st) {
			return &Handle{l: l, s: st}, nil
		}
		i++
	}
	g.live.Add(-1)
	st.closeUp()
	if st.pendp != nil {
		putBuf(st.pendp)
		st.pendp, st.first = nil, nil
	}
	s.Out = out // the caller's again, with the client's connection
	if err := g.Err(); err != nil && !g.closing.Load() {
		return nil, err // every loop failed (loop.fail wraps ErrFailed)
	}
	return nil, ErrClosed
}

// EndAll ends every stream running now with err (for example the drain's
// cause), as Handle.End does. The loops keep running.
func (g *Group) EndAll(err error) {
	for _, l := range g.loops {
		l.command(func() { l.endAll(err, false) })
	}
}

// Close ends every stream with ErrClosed and stops the loops; it returns
// once they have exited.
func (g *Group) Close() {
	g.closing.Store(true)
	g.once.Do(func() {
		for _, l := range g.loops {
			l.stop()
		}
		g.wg.Wait()
	})
}

// fdOf returns c's own descriptor (non-blocking: Go's netpoller set it
// so).
func fdOf(c net.Conn) (int, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return -1, errors.New("evloop: connection has no file descriptor")
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	if err := raw.Control(func(f uintptr) { fd = int(f) }); err != nil {
		return -1, err
	}
	return fd, nil
}
