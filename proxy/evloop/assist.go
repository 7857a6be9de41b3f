package evloop

import (
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// assistant relays part of a long batch on a second goroutine
// (Options.Assist): the loop and its assistant take the batch's plain
// backend reads from one list, in order, each with a read and an out
// buffer of its own, so that on an idle P the last streams of a long
// batch do not wait for all before them. The assistant handles only the
// common case (read, relay the events, write all of them); any other
// outcome (the stream's end, an error, a short write) is left on the
// stream for the loop, which settles it after the batch (assistDone).
type assistant struct {
	wake  chan struct{} // buffered 1; closed when the loop exits
	batch atomic.Pointer[assistBatch]
	rbuf  []byte
	out   []byte
}

// assistBatch is one batch's shared list. Each batch gets a new one: an
// assistant that still holds an old one finds nothing left to take.
type assistBatch struct {
	items []*stream
	next  atomic.Int32 // the next item to take
	busy  atomic.Int32 // the assistant is between taking and finishing an item
}

// assistLeft is what the assistant left for the loop on a stream.
type assistLeft uint8

const (
	leftNone   assistLeft = iota
	leftSettle            // settle(s, aOut, aDone, aErr)
	leftEnd               // end(s, aErr): EOF or a read error
	leftWrite             // write(s, aOut): what the socket did not take
	leftGone              // the client's write failed
)

// assistState is a stream's share of the assistant's work: written by
// whoever relays the stream in the batch, read by the loop after it.
type assistState struct {
	left  assistLeft
	aOut  *[]byte
	aDone bool
	aErr  error
}

func newAssistant(bufSize int) *assistant {
	return &assistant{wake: make(chan struct{}, 1), rbuf: make([]byte, bufSize),
		out: make([]byte, 0, bufSize+bufSize/4)}
}

// assistRun is the assistant's goroutine: it ends when the loop closes
// wake (run's return).
func (l *loop) assistRun() {
	defer l.g.wg.Done()
	a := l.assist
	for range a.wake {
		b := a.batch.Load()
		if b == nil {
			continue
		}
		for {
			b.busy.Add(1)
			i := int(b.next.Add(1)) - 1
			if i >= len(b.items) {
				b.busy.Add(-1)
				break
			}
			l.assistRelay(b.items[i], a.rbuf, a.out, time.Now())
			b.busy.Add(-1)
		}
	}
}

// eligible reports whether s's backend read in this batch may go to the
// shared list: a plain socket stream, reading, nothing pending.
func (s *stream) eligible() bool {
	return s.csink == nil && !s.ending && !s.closed && len(s.pend) == 0 && s.ufd >= 0
}

// split relays the batch's eligible backend reads in items with the
// assistant; it returns when the list is taken, the assistant's last
// items may still run (wait for them with join, then settle what the
// assistant left with assistDone).
func (l *loop) split(items []*stream, now time.Time) *assistBatch {
	b := &assistBatch{items: items}
	l.assist.batch.Store(b)
	select {
	case l.assist.wake <- struct{}{}:
	default:
	}
	for !assistOnly.Load() {
		i := int(b.next.Add(1)) - 1
		if i >= len(items) {
			break
		}
		l.upstreamReady(items[i], now)
	}
	for assistOnly.Load() && int(b.next.Load()) < len(items) {
		runtime.Gosched()
	}
	return b
}

// assistOnly (tests) leaves every item of a split batch to the assistant.
var assistOnly atomic.Bool

// join waits until the assistant has finished b's items. The assistant
// raises busy before it takes an item, so once the loop has found the
// list exhausted, an item the assistant took is one busy still counts.
func (b *assistBatch) join() {
	for b.busy.Load() != 0 {
		runtime.Gosched()
	}
}

// assistDone settles, on the loop, what the assistant left on b's streams.
func (l *loop) assistDone(b *assistBatch, now time.Time) {
	for _, s := range b.items {
		st := &s.assist
		left := st.left
		if left == leftNone {
			continue
		}
		st.left = leftNone
		out, done, err := []byte(nil), st.aDone, st.aErr
		if st.aOut != nil {
			out = append(l.out[:0], *st.aOut...)
			putBuf(st.aOut)
			st.aOut = nil
		}
		st.aDone, st.aErr = false, nil
		switch left {
		case leftSettle:
			l.settle(s, out, done, err)
		case leftEnd:
			l.end(s, err)
		case leftWrite:
			l.out = out[:0]
			l.write(s, out)
		case leftGone:
			l.gone(s)
		}
		if !s.ending && !s.closed && len(s.pend) == 0 {
			l.upstreamReady(s, now) // read on to EAGAIN (edge-triggered)
		}
	}
}

// assistRelay is upstreamReady on the assistant: the common case only.
func (l *loop) assistRelay(s *stream, rbuf, out []byte, now time.Time) {
	st := &s.assist
	for {
		n, err := rawRead(s.ufd, rbuf)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return
		}
		if n <= 0 {
			if err == nil {
				err = ErrUpstreamCut
			}
			st.left, st.aErr = leftEnd, err
			return
		}
		s.last = now
		o, done, ferr := l.feed(s, out[:0], rbuf[:n], now)
		if done || ferr != nil {
			st.left, st.aDone, st.aErr = leftSettle, done, ferr
			st.aOut = getBuf()
			*st.aOut = append(*st.aOut, o...)
			return
		}
		if len(o) > 0 {
			w, werr := rawWrite(s.cfd, o)
			for werr == unix.EINTR {
				w, werr = rawWrite(s.cfd, o)
			}
			if werr != nil && werr != unix.EAGAIN {
				st.left = leftGone
				return
			}
			w = max(w, 0)
			s.sent += int64(w)
			if w < len(o) {
				st.left = leftWrite
				st.aOut = getBuf()
				*st.aOut = append(*st.aOut, o[w:]...)
				return
			}
		}
		if n < len(rbuf) && !s.upHup {
			return
		}
	}
}

// splitBatch collects the batch's eligible backend reads (streams whose
// client socket is not also in the batch) and, when there are at least
// Options.Assist of them, relays them with the assistant (split); nil
// when the batch is too short.
func (l *loop) splitBatch(n int, now time.Time) *assistBatch {
	l.seq++
	ready := l.ready[:n]
	for _, ev := range ready {
		if s := l.fdStream(int(ev.Fd)); s != nil && int(ev.Fd) == s.cfd {
			s.mark = l.seq
		}
	}
	items := l.items[:0]
	for _, ev := range ready {
		s := l.fdStream(int(ev.Fd))
		if s == nil || int(ev.Fd) != s.ufd || s.mark == l.seq || !s.eligible() {
			continue
		}
		if ev.Events&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
			s.upHup = true // read to EOF: no edge will come for it
		}
		s.inSplit = true
		items = append(items, s)
	}
	l.items = items[:0]
	if len(items) < l.opts.Assist {
		for _, s := range items {
			s.inSplit = false
		}
		return nil
	}
	return l.split(append([]*stream(nil), items...), now)
}

// fdStream is the stream that fd belongs to, or nil.
func (l *loop) fdStream(fd int) *stream {
	if fd < 0 || fd >= len(l.byFD) {
		return nil
	}
	return l.byFD[fd]
}
