package proxy

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/limiter"
)

// Sink is where the pipeline writes one request's response: the HTTP
// response (ServeHTTP), a request frame's chunk and terminal frames (the
// WebSocket bridge), or, later, an event loop that takes committed streams
// over. The pipeline calls it from one goroutine, in this order:
//
//	Header (any time before Start or Error)
//	Start, then Event… or Raw… (stream), or Body… (non-streamed answer)
//	Error (in place of Start, or as a started stream's last event)
//	End (once, last, whatever happened)
//
// Each Event and Raw call is delivered (flushed) before it returns, never
// batched with the next. A non-nil error means the client is gone or too
// slow: the pipeline stops relaying and does not write again (End still
// comes). The byte slices passed in belong to the caller and are valid only
// during the call; a sink that keeps bytes copies them. n is how many bytes
// the client was given, as the access log counts them.
type Sink interface {
	// Header is the response's header map; changes after Start (or a
	// whole-response Error) are not sent, except as trailers by End.
	Header() http.Header
	// Start begins the response with status and Header. stream reports
	// that events follow (Event or Raw), else a Body or nothing. The
	// header may be held until the first event, which it then travels with.
	Start(status int, stream bool)
	// Event delivers one complete SSE event of an OpenAI stream: ev is the
	// event as received (its lines through the blank line), data its data
	// payload (nil for comments and keep-alives), so that a sink that is
	// not SSE needs no parsing.
	Event(ev, data []byte) (n int, err error)
	// Raw delivers bytes of a generic event stream as read, in arbitrary
	// pieces (an event may span calls). Raw(nil) sends the header at once:
	// an idle EventSource must see it.
	Raw(p []byte) (n int, err error)
	// Body delivers a non-streamed answer after Start: whole in one call
	// when it is short, else in pieces as they arrive (respbody.go).
	Body(b []byte) (n int, err error)
	// Error ends the response with an error: body is the error object in
	// the request's API shape (OpenAI's, or Anthropic's on /v1/messages; a
	// started Responses stream gets its error event's data; JSON, no
	// trailing newline). Before Start it is the
	// whole response with status; after a stream started it is the
	// stream's last event.
	Error(status int, body []byte) (n int, err error)
	// End completes the response. trailer is nil unless a stream finished
	// ([DONE]) and the client asked for trailers ("TE: trailers"). The
	// pipeline calls it after the request has been settled and logged, as
	// its last act; the HTTP sink writes there the stream's last event,
	// which it held (see httpSink.Last), so that the event and the trailer
	// leave together.
	End(trailer http.Header)
}

// Outcome is what the pipeline reports about one request once it has ended,
// settled and been logged.
type Outcome struct {
	// RequestID is the request's X-Request-Id.
	RequestID string
	// Status is the status answered; 0 when nothing was, 499 when the
	// client left before an answer.
	Status int
	// Err is why the request failed, nil when it succeeded. A stream that
	// failed after it started has Status 200 and a non-nil Err.
	Err error
	// Usage is the backend's usage report; nil when it sent none.
	Usage *limiter.Usage
	// RetryAfter is a limiter refusal's exact wait; zero otherwise.
	RetryAfter time.Duration
	// Timing is every stage measured, as a JSON object with
	// Server-Timing's names (see timingJSON). Serve fills it; ServeHTTP,
	// which sends timing in headers and trailers, does not.
	Timing json.RawMessage
}

// httpSink writes the response to an http.ResponseWriter, flushing each
// event through an http.ResponseController.
type httpSink struct {
	w       http.ResponseWriter
	rc      http.ResponseController
	started bool
	// last is the stream's last event, held by Last for End.
	last []byte
}

var _ Sink = (*httpSink)(nil)

func newHTTPSink(w http.ResponseWriter) *httpSink {
	return &httpSink{w: w, rc: *http.NewResponseController(w)}
}

func (s *httpSink) Header() http.Header { return s.w.Header() }

// Start writes the status line; the header goes out with the first event
// (or at the first flush).
func (s *httpSink) Start(status int, _ bool) {
	s.started = true
	s.w.WriteHeader(status)
}

func (s *httpSink) Event(ev, _ []byte) (int, error) { return s.send(ev) }

func (s *httpSink) Raw(p []byte) (int, error) { return s.send(p) }

// send writes p (nothing when empty) and flushes.
func (s *httpSink) send(p []byte) (n int, err error) {
	if len(p) > 0 {
		n, err = s.w.Write(p)
	}
	if err == nil {
		err = s.rc.Flush()
	}
	return n, err
}

func (s *httpSink) Body(b []byte) (int, error) { return s.w.Write(b) }

// Error answers status with body and a newline before the response
// started, and sends an "error" event after.
func (s *httpSink) Error(status int, body []byte) (int, error) {
	if s.started {
		return s.send(ErrorEvent(body))
	}
	s.Start(status, false)
	n, err := s.w.Write(body)
	if err == nil {
		_, err = s.w.Write(newline)
	}
	return n, err
}

var newline = []byte{'\n'}

// Last holds a stream's last event for End, unflushed; it reports the
// event as delivered. The pipeline calls it, in place of Event, only when a
// trailer follows.
func (s *httpSink) Last(ev, _ []byte) (int, error) {
	s.last = append(s.last[:0], ev...)
	return len(ev), nil
}

// End writes the held last event without flushing it and declares the
// trailers (http.TrailerPrefix form: the header was sent before they were
// known). The server writes the trailers right after the handler returns,
// which it does at once (End is the pipeline's last act): the event, the
// trailer and the end of the stream leave together (on HTTP/3, in the same
// packet or burst; on HTTP/1.1, in the same write as the last chunk).
func (s *httpSink) End(trailer http.Header) {
	if len(s.last) > 0 {
		s.w.Write(s.last)
		s.last = nil
	}
	h := s.w.Header()
	for k, vv := range trailer {
		h[http.TrailerPrefix+k] = vv
	}
}

// responseWriter is the client's ResponseWriter when the exchange answers
// over HTTP, else nil: a WebSocket passthrough hijacks it, and the body
// reader tells the server to close a connection whose body was too large.
func (x *exchange) responseWriter() http.ResponseWriter {
	if s, ok := x.sink.(*httpSink); ok {
		return s.w
	}
	return nil
}

// sendError answers e through s in OpenAI's error shape, as WriteError
// does on a ResponseWriter: nothing is sent for 499 (nobody listens).
func sendError(s Sink, e *APIError) { sendErrorBody(s, e, e.body()) }

// sendErrorBody is sendError with the body in the request's dialect.
func sendErrorBody(s Sink, e *APIError, body []byte) {
	h := s.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	if e.Status == 499 {
		return
	}
	s.Error(e.Status, body)
}

// answer sends a whole JSON body with status.
func (x *exchange) answer(status int, body []byte) {
	x.sink.Header().Set("Content-Type", "application/json")
	x.status = status
	x.sink.Start(status, false)
	x.sink.Body(body)
}
