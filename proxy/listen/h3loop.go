package listen

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/sluice-proxy/sluice/proxy/evloop"
)

// A committed HTTP/3 response stream relayed by an event loop
// (proxy/evloop) instead of its handler's goroutine: the stream was taken
// over from quic-go's writer at its first flush (h3Writer), and the loop
// gives each batch's bytes to the QUIC stream as one DATA frame with
// quic-go's TryWriteAll, which copies them and signals the connection's
// run loop, or takes nothing when the stream's flow-control window cannot
// take the whole frame. Then the frame goes to a goroutine that exists
// only while the stream is blocked: it waits in quic-go's Write until the
// client's window opens, and resumes the loop's stream through its
// command queue (Waker.Resume); the loop reads the backend again only
// then. The stream's send side ending (the client's STOP_SENDING, the
// connection's close) reaches the loop as Waker.Gone. See
// docs/ARCHITECTURE.md, "Event loop".

// H3LoopStream is an HTTP/3 stream handed to an event loop: its
// evloop.ClientSink.
type H3LoopStream struct {
	w *h3Writer

	mu      sync.Mutex
	frame   []byte       // the DATA frame being written (the writer's while blocked)
	blocked bool         // a blocked writer goroutine holds frame
	closing bool         // Close was called (the writer ends the stream if blocked)
	reset   bool         // Close's reset
	err     error        // a write failed: the client is gone
	trailer []byte       // the trailer's HEADERS frame, nil when none
	stop    func() bool  // stops the Gone watch
	wk      evloop.Waker // the loop's handle (Attach)
}

var _ evloop.ClientSink = (*H3LoopStream)(nil)

// tailWait bounds the writes of a stream's last bytes after the loop let
// go of it (a blocked frame, the trailer): a client that does not open
// its window within it gets the stream reset.
const tailWait = 10 * time.Second

// DetachH3 hands the HTTP/3 response stream of w (the handler's
// ResponseWriter) over to an event loop: when the handler returns, the
// stream stays open for the returned sink, which ends it (Close). The
// stream must have been taken over (the response flushed). It reports
// false, changing nothing, when w is not such a stream or the stream can
// no longer be written.
func DetachH3(w http.ResponseWriter) (*H3LoopStream, bool) {
	hw, ok := w.(*h3Writer)
	if !ok || hw.str == nil || hw.err != nil || hw.loop || hw.qs.Context().Err() != nil {
		return nil, false
	}
	hw.loop = true
	return &H3LoopStream{w: hw, frame: hw.frame[:0]}, true
}

// Reattach gives the stream back to its handler (no loop took it); it
// must be called before the handler returns.
func (s *H3LoopStream) Reattach() { s.w.loop = false }

// SetTrailer sets the trailer fields Close sends in a HEADERS frame
// before the stream's end.
func (s *H3LoopStream) SetTrailer(h http.Header) {
	t := encodeTrailer(h)
	s.mu.Lock()
	s.trailer = t
	s.mu.Unlock()
}

// Attach is evloop.ClientSink's: the end of the stream's send side (the
// client's STOP_SENDING, the connection's close, or a reset) calls
// w.Gone, at once when it ended before.
func (s *H3LoopStream) Attach(w evloop.Waker) {
	s.mu.Lock()
	s.wk = w
	s.stop = context.AfterFunc(s.w.qs.Context(), w.Gone)
	s.mu.Unlock()
}

// Write is evloop.ClientSink's: p becomes one DATA frame, given to the
// stream at the batch's end (Flush; at once past maxBatch) when its window takes it whole; else a goroutine
// waits to write it (writeBlocked) and Write takes nothing until that
// write is done.
func (s *H3LoopStream) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return 0, s.err
	}
	if s.blocked || len(p) == 0 {
		return 0, nil
	}
	s.frame = appendData(s.frame, p)
	if len(s.frame) >= maxBatch {
		if err := s.giveLocked(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// A stream's frames go to quic-go once per loop batch (Flush), so that
// the connection's run loop, woken by the first stream written, finds the
// batch's other tokens queued when it packs: fewer packets (giving each
// Write's frame at once measured dearer: docs/BENCHMARKS.md, "h3loop").
// maxBatch bounds the frames a stream holds until Flush.
const maxBatch = 64 << 10

// giveLocked gives the held frames to the stream: queued at once when its
// window takes them whole, else to a blocked writer goroutine.
func (s *H3LoopStream) giveLocked() error {
	if len(s.frame) == 0 {
		return nil
	}
	switch err := s.w.qs.TryWriteAll(s.frame); {
	case err == nil:
		s.frame = s.frame[:0]
		return nil
	case errors.Is(err, quic.ErrWouldBlock):
		s.blocked = true
		go s.writeBlocked(s.frame)
		s.frame = nil // the writer's until it is done
		return nil
	default:
		s.err = err
		return err
	}
}

// writeBlocked writes a frame the stream's window could not take at once,
// waiting for the client (it exists only while the stream is blocked),
// then lets the loop go on (Resume), or ends the stream when the loop
// closed it meanwhile.
func (s *H3LoopStream) writeBlocked(frame []byte) {
	_, err := s.w.qs.Write(frame)
	s.mu.Lock()
	s.blocked = false
	s.frame = frame[:0]
	if err != nil && s.err == nil {
		s.err = err
	}
	closing, wk := s.closing, s.wk
	s.mu.Unlock()
	if closing {
		s.end(true)
		return
	}
	// The loop offers its pending bytes again (a failed write makes the
	// next Write report the client gone; the stream's context ends too).
	wk.Resume()
}

// Flush is evloop.ClientSink's: the batch's frames go to the stream
// (giveLocked), which signals the connection's run loop.
func (s *H3LoopStream) Flush() {
	s.mu.Lock()
	if !s.blocked && s.err == nil {
		s.giveLocked()
	}
	s.mu.Unlock()
}

// Close is evloop.ClientSink's: the trailer (when set) and the stream's
// end, or with reset a RESET_STREAM (H3_REQUEST_CANCELLED). A blocked
// writer goroutine ends the stream once its frame is written (a reset
// unblocks it at once).
func (s *H3LoopStream) Close(reset bool) {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return
	}
	if s.stop != nil {
		s.stop() // our own end is not the client's
	}
	if !reset && !s.blocked && s.err == nil {
		s.giveLocked() // what the batch left
	}
	s.closing, s.reset = true, reset
	blocked := s.blocked
	s.mu.Unlock()
	if blocked {
		if reset {
			s.cancel() // the blocked write returns at once
		} else {
			s.w.qs.SetWriteDeadline(time.Now().Add(tailWait))
		}
		return
	}
	s.end(false)
}

// end writes the trailer and ends the stream (reset, or after a failed
// write, cancels it). mayWait: on the blocked writer's goroutine, which
// may wait for the window; on the loop, a trailer the window cannot take
// goes to a goroutine.
func (s *H3LoopStream) end(mayWait bool) {
	s.mu.Lock()
	reset, err, t := s.reset, s.err, s.trailer
	s.mu.Unlock()
	if reset || err != nil {
		s.cancel()
		return
	}
	if t != nil {
		if mayWait {
			s.writeTail(t)
			return
		}
		switch err := s.w.qs.TryWriteAll(t); {
		case errors.Is(err, quic.ErrWouldBlock):
			go s.writeTail(t)
			return
		case err != nil:
			s.cancel()
			return
		}
	}
	s.closeStream()
}

// writeTail writes the trailer's frame, waiting at most tailWait, then
// ends the stream.
func (s *H3LoopStream) writeTail(t []byte) {
	s.w.qs.SetWriteDeadline(time.Now().Add(tailWait))
	if _, err := s.w.qs.Write(t); err != nil {
		s.cancel()
		return
	}
	s.closeStream()
}

// closeStream ends the stream cleanly, as quic-go's server does after a
// handler.
func (s *H3LoopStream) closeStream() {
	s.w.str.CancelRead(quic.StreamErrorCode(http3.ErrCodeNoError)) // no-op when the body was read to EOF
	s.w.str.Close()
}

// cancel resets both directions of the stream.
func (s *H3LoopStream) cancel() {
	s.w.str.CancelRead(quic.StreamErrorCode(http3.ErrCodeRequestCanceled))
	s.w.str.CancelWrite(quic.StreamErrorCode(http3.ErrCodeRequestCanceled))
}
