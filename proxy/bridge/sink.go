package bridge

import (
	"bytes"
	"context"
	"net/http"

	"github.com/sluice-proxy/sluice/proxy"
)

// doneMarker is the data of the event that ends an OpenAI stream.
var doneMarker = []byte("[DONE]")

// maxErrorBody bounds the body of a non-200 response kept for its error
// frame.
const maxErrorBody = 64 << 10

// bridgeSink is the Sink a bridged request is served with. Each event
// becomes a chunk frame, queued for the client as it arrives (no batching);
// it keeps what the terminal frame needs besides the Outcome: the status
// and, for errors and non-streamed answers, the body.
//
// An OpenAI stream arrives as events (Event): the data payload is the
// chunk's data, and the pipeline's own [DONE] and error events are dropped
// (the terminal frame says them). A generic stream arrives as raw bytes
// (Raw), split into events here, each a chunk, [DONE] and errors included.
type bridgeSink struct {
	rq     *wsRequest
	hdr    http.Header
	status int
	stream bool
	raw    bool   // the stream arrives as raw bytes
	body   []byte // non-200 or non-streamed response body
	// pending holds a partial event when a raw piece ends inside one.
	pending []byte
	failed  error
}

var _ proxy.Sink = (*bridgeSink)(nil)

func (s *bridgeSink) Header() http.Header { return s.hdr }

func (s *bridgeSink) Start(status int, stream bool) {
	if s.status != 0 || status < 200 {
		return
	}
	s.status = status
	s.stream = stream && status == http.StatusOK
}

// Event queues an OpenAI stream's event as a chunk frame, waiting while the
// send queue is full; it fails when the request is cancelled, the socket is
// gone, or the client reads too slowly.
func (s *bridgeSink) Event(ev, data []byte) (int, error) {
	if s.failed != nil {
		return 0, s.failed
	}
	if data == nil || bytes.Equal(data, doneMarker) {
		return len(ev), nil // keep-alives; [DONE] is the done frame
	}
	name := eventName(ev)
	if name == "error" {
		return len(ev), nil // the error frame says it
	}
	if err := s.chunk(name, data); err != nil {
		s.failed = err
		return 0, err
	}
	return len(ev), nil
}

// Raw queues a chunk frame per complete event of a generic stream.
func (s *bridgeSink) Raw(p []byte) (int, error) {
	s.raw = true
	if s.failed != nil {
		return 0, s.failed
	}
	data := p
	if len(s.pending) > 0 {
		s.pending = append(s.pending, p...)
		data = s.pending
	}
	for {
		n := eventEnd(data)
		if n < 0 {
			break
		}
		if err := s.rawEvent(data[:n]); err != nil {
			s.failed = err
			return 0, err
		}
		data = data[n:]
	}
	if len(data) > proxy.MaxEventBytes {
		s.failed = proxy.ErrEventTooLarge
		return 0, s.failed
	}
	s.pending = append(s.pending[:0], data...) // data may alias p or pending
	return len(p), nil
}

// rawEvent queues one event of a generic stream.
func (s *bridgeSink) rawEvent(ev []byte) error {
	data := proxy.EventData(ev)
	if data == nil {
		return nil // comments and keep-alives
	}
	return s.chunk(eventName(ev), data)
}

// chunk queues a chunk frame.
func (s *bridgeSink) chunk(name string, data []byte) error {
	f := getFrame()
	*f = appendChunk(*f, s.rq.prefix, name, data)
	return s.rq.c.enqueue(s.rq.ctx, f, s.rq.slowTimer())
}

// Body keeps a whole answer, sent as one frame at the end. The pipeline
// bounds a successful one (max_response_bytes); an error body is cut.
func (s *bridgeSink) Body(b []byte) (int, error) {
	if s.failed != nil {
		return 0, s.failed
	}
	n := len(b)
	if s.status != http.StatusOK && len(s.body)+n > maxErrorBody {
		b = b[:max(maxErrorBody-len(s.body), 0)]
	}
	s.body = append(s.body, b...)
	return n, nil
}

// Error keeps an error answer for the error frame. A generic stream's
// error event is relayed like its other events.
func (s *bridgeSink) Error(status int, body []byte) (int, error) {
	switch {
	case s.status == 0:
		s.Start(status, false)
		return s.Body(body)
	case s.stream && s.raw:
		return s.Raw(proxy.ErrorEvent(body))
	}
	return 0, nil // the error frame says it
}

// End does nothing: the terminal frame is built from the Outcome.
func (s *bridgeSink) End(http.Header) {}

// eventEnd returns the length of the first complete SSE event in b
// (through its blank line), or -1.
func eventEnd(b []byte) int {
	for i := 0; i < len(b); {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return -1
		}
		k := i + j + 1 // start of the next line
		switch {
		case k < len(b) && b[k] == '\n':
			return k + 1
		case k+1 < len(b) && b[k] == '\r' && b[k+1] == '\n':
			return k + 2
		}
		i = k
	}
	return -1
}

// eventName returns the value of an event's "event:" field, or "".
func eventName(ev []byte) string {
	for len(ev) > 0 {
		line := ev
		if i := bytes.IndexByte(ev, '\n'); i >= 0 {
			line, ev = ev[:i], ev[i+1:]
		} else {
			ev = nil
		}
		if v, ok := bytes.CutPrefix(bytes.TrimSuffix(line, []byte("\r")), []byte("event:")); ok {
			return string(bytes.TrimPrefix(v, []byte(" ")))
		}
	}
	return ""
}

// terminal builds the frame that ends the request: done, or error.
func (s *bridgeSink) terminal(o *proxy.Outcome) []byte {
	rq := s.rq
	switch {
	case s.failed == errSlowClient:
		return newErrorFrame(rq.id, o.RequestID, &proxy.APIError{Status: http.StatusRequestTimeout, Type: "invalid_request_error",
			Code: "slow_client", Message: "the client did not read frames in time; the request was cancelled"})
	case rq.cancelled.Load() && (o.Err != nil || s.status == 0):
		return newErrorFrame(rq.id, o.RequestID, &proxy.APIError{Status: 499, Type: "invalid_request_error",
			Code: "cancelled", Message: "the request was cancelled by a cancel frame"})
	case s.status == 0 || (s.status == http.StatusOK && o.Err != nil):
		ae := proxy.ErrorOf(o.Err)
		if o.Err == nil {
			ae = proxy.ErrorOf(context.Canceled)
		}
		return newErrorFrame(rq.id, o.RequestID, ae)
	case s.status != http.StatusOK:
		return newErrorFrameRaw(rq.id, o.RequestID, s.status, s.hdr, s.body, o.RetryAfter)
	}
	return newDoneFrame(rq.id, o)
}
