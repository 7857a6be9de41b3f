package proxy

import (
	"bytes"
	"context"
	"net/http"
)

// maxErrorBody bounds the body of a non-200 response kept for its error
// frame.
const maxErrorBody = 64 << 10

// wsResponse is the http.ResponseWriter a bridged request is served with.
// It turns each SSE event the relay writes into a chunk frame, queued for
// the client as it arrives (no batching), and keeps what the terminal
// frame needs: the status and, for errors and non-streamed responses, the
// body.
type wsResponse struct {
	rq     *wsRequest
	hdr    http.Header
	status int
	stream bool
	openAI bool   // drop the pipeline's own [DONE] and error events
	body   []byte // non-200 or non-streamed response body
	// pending holds a partial event when a write ends inside one (raw
	// streams are relayed in arbitrary pieces; OpenAI streams never are).
	pending []byte
	failed  error
}

func (w *wsResponse) Header() http.Header { return w.hdr }

func (w *wsResponse) WriteHeader(code int) {
	if w.status != 0 || code < 200 {
		return
	}
	w.status = code
	w.stream = code == http.StatusOK && isEventStream(w.hdr)
}

// Write takes one piece of the response. For a stream it queues a chunk
// frame per complete event, waiting while the send queue is full; it fails
// when the request is cancelled, the socket is gone, or the client reads
// too slowly.
func (w *wsResponse) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.failed != nil {
		return 0, w.failed
	}
	if !w.stream {
		// A whole body, sent as one frame at the end. The pipeline bounds
		// a successful one (max_response_bytes); an error body is cut.
		n := len(p)
		if w.status != http.StatusOK && len(w.body)+n > maxErrorBody {
			p = p[:max(maxErrorBody-len(w.body), 0)]
		}
		w.body = append(w.body, p...)
		return n, nil
	}
	data := p
	if len(w.pending) > 0 {
		w.pending = append(w.pending, p...)
		data = w.pending
	}
	for {
		n := eventEnd(data)
		if n < 0 {
			break
		}
		if err := w.event(data[:n]); err != nil {
			w.failed = err
			return 0, err
		}
		data = data[n:]
	}
	if len(data) > maxEventBytes {
		w.failed = errEventTooLarge
		return 0, w.failed
	}
	w.pending = append(w.pending[:0], data...) // data may alias p or pending
	return len(p), nil
}

// Flush is a no-op: every event is queued as it is written.
func (w *wsResponse) Flush() {}

// FlushError reports a failed write, for http.ResponseController.
func (w *wsResponse) FlushError() error { return w.failed }

// event queues one SSE event as a chunk frame.
func (w *wsResponse) event(ev []byte) error {
	data := eventData(ev)
	if data == nil {
		return nil // comments and keep-alives
	}
	name := eventName(ev)
	if w.openAI && (bytes.Equal(data, doneMarker) || name == "error") {
		return nil // the terminal frame says it
	}
	f := getFrame()
	*f = appendChunk(*f, w.rq.prefix, name, data)
	return w.rq.c.enqueue(w.rq.ctx, f, w.rq.slowTimer())
}

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
func (w *wsResponse) terminal(o *outcome) []byte {
	rq := w.rq
	switch {
	case w.failed == errSlowClient:
		return newErrorFrame(rq.id, o.id, &apiError{Status: http.StatusRequestTimeout, Type: "invalid_request_error",
			Code: "slow_client", Message: "the client did not read frames in time; the request was cancelled"})
	case rq.cancelled.Load() && (o.err != nil || w.status == 0):
		return newErrorFrame(rq.id, o.id, &apiError{Status: 499, Type: "invalid_request_error",
			Code: "cancelled", Message: "the request was cancelled by a cancel frame"})
	case w.status == 0 || (w.status == http.StatusOK && o.err != nil):
		ae := statusOf(o.err)
		if o.err == nil {
			ae = statusOf(context.Canceled)
		}
		return newErrorFrame(rq.id, o.id, ae)
	case w.status != http.StatusOK:
		return newErrorFrameRaw(rq.id, o.id, w.status, w.hdr, w.body, o.retryAfter)
	}
	return newDoneFrame(rq.id, o)
}
