package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net"
	"net/http"
	"strconv"

	"github.com/sluice-proxy/sluice/proxy/listen"
	"github.com/sluice-proxy/sluice/proxy/ws"
	"github.com/sluice-proxy/sluice/routing"
)

// Conditions the pipeline branches on; ErrorOf maps each to a response.
var (
	errFirstTokenTimeout = errors.New("backend sent no first token in time")
	errStreamIdle        = errors.New("backend stream stalled")
	errStreamCut         = errors.New("backend closed the stream before [DONE]")
	errResponseTooLarge  = errors.New("backend response too large")
	errResponseMemory    = errors.New("node's response memory exhausted")
	// errLoopFailed is Sluice's own failure, not the backend's: the
	// event loops failed (proxy/evloop.ErrFailed) under a stream or
	// refused it. It wraps the loop's error.
	errLoopFailed = errors.New("event loop failed")
)

// ErrEventTooLarge fails a stream with an event over MaxEventBytes;
// ErrorOf answers it as a 502 upstream_stream_broken.
var ErrEventTooLarge = errors.New("backend sent an oversized event")

// APIError is an error answered in OpenAI's error shape:
// {"error":{"message","type","param","code"}}.
type APIError struct {
	// Status is the HTTP status answered. 499 means the client left: no
	// response is written.
	Status int
	// Type is OpenAI's error type, e.g. "invalid_request_error" or
	// "server_error".
	Type string
	// Code is the machine-readable reason, e.g. "invalid_api_key".
	Code string
	// Message is the human-readable explanation; Error returns it.
	Message string
	// RetryAfter, when positive, is sent as Retry-After (seconds). Zero
	// means no Retry-After.
	RetryAfter int
}

func (e *APIError) Error() string { return e.Message }

func badRequest(code, msg string) *APIError {
	return &APIError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: code, Message: msg}
}

// upstreamStatus is a 5xx answer from a backend before the first token;
// it is retried on another backend and passed through if it is the last.
type upstreamStatus struct {
	resp *http.Response
	body []byte
}

func (e *upstreamStatus) Error() string {
	return "backend answered " + strconv.Itoa(e.resp.StatusCode)
}

// ErrorOf is the one mapping from errors to client responses: an *APIError
// in err's chain is returned as is; the pipeline's conditions (a sentinel
// such as ErrEventTooLarge, routing's and listen's errors, cancellation,
// timeouts) get their status and code; anything else is a 502
// upstream_unreachable. It never returns nil.
func ErrorOf(err error) *APIError {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae
	}
	switch {
	case errors.Is(err, ws.ErrOriginNotAllowed):
		return &APIError{Status: http.StatusForbidden, Type: "invalid_request_error", Code: "origin_not_allowed",
			Message: "WebSocket connections from this origin are not allowed"}
	case errors.Is(err, routing.ErrNoHealthyBackend):
		return &APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "no_healthy_backend",
			Message: "no healthy backend is available for this model; retry shortly", RetryAfter: retryAfterOf(err)}
	case errors.Is(err, routing.ErrQueueTimeout):
		return &APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "queue_timeout",
			Message:    "every backend is at its target load and the request waited too long in the queue; retry shortly",
			RetryAfter: retryAfterOf(err)}
	case errors.Is(err, routing.ErrTTFTObjective):
		return &APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "ttft_objective_unmet",
			Message:    "every backend is predicted to miss this route's time-to-first-token objective; retry after the delay given",
			RetryAfter: retryAfterOf(err)}
	case errors.Is(err, routing.ErrQueueFull):
		return &APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "queue_full",
			Message: "every backend is at its target load and the queue is full; retry shortly", RetryAfter: retryAfterOf(err)}
	case errors.Is(err, errFirstTokenTimeout), errors.Is(err, errStreamIdle):
		return &APIError{Status: http.StatusGatewayTimeout, Type: "server_error", Code: "upstream_timeout",
			Message: "the backend did not answer in time"}
	case errors.Is(err, listen.ErrDraining):
		return &APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "shutting_down",
			Message: "this edge node is shutting down; retry", RetryAfter: 1}
	case errors.Is(err, errLoopFailed):
		return &APIError{Status: http.StatusInternalServerError, Type: "server_error", Code: "internal_error",
			Message: "this edge node failed while relaying the stream; retry", RetryAfter: 1}
	case errors.Is(err, context.Canceled):
		return &APIError{Status: 499, Type: "invalid_request_error", Code: "client_closed_request",
			Message: "the client closed the request"}
	case errors.Is(err, errStreamCut), errors.Is(err, ErrEventTooLarge):
		return &APIError{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_stream_broken",
			Message: "the backend stream broke before it finished: " + err.Error()}
	case errors.Is(err, errResponseMemory):
		return &APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "response_memory_exhausted",
			Message: "the node is buffering too many responses; retry", RetryAfter: 1}
	case errors.Is(err, errResponseTooLarge):
		return &APIError{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_response_too_large",
			Message: "the backend's response exceeded the configured maximum"}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return &APIError{Status: http.StatusGatewayTimeout, Type: "server_error", Code: "upstream_timeout",
			Message: "the backend did not answer in time"}
	}
	return &APIError{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_unreachable",
		Message: "the backend could not be reached or failed"}
}

// retryAfterOf is the Retry-After (whole seconds, at least 1) for a
// routing error.
func retryAfterOf(err error) int {
	return max(1, int(math.Ceil(routing.RetryAfter(err).Seconds())))
}

type errorBody struct {
	Error errorFields `json:"error"`
}

type errorFields struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

func (e *APIError) body() []byte {
	b, _ := json.Marshal(errorBody{Error: e.fields()})
	return b
}

func (e *APIError) fields() errorFields {
	return errorFields{Message: e.Message, Type: e.Type, Code: e.Code}
}

// Object is e's error object, the value of the response body's "error"
// field: {"message","type","param":null,"code"}.
func (e *APIError) Object() json.RawMessage {
	b, _ := json.Marshal(e.fields())
	return b
}

// WriteError answers e on w as JSON in OpenAI's error shape, with
// Retry-After when e has one; for status 499 it only sets the headers.
func WriteError(w http.ResponseWriter, e *APIError) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	status := e.Status
	if status == 499 { // nobody is listening; keep the log honest
		return
	}
	w.WriteHeader(status)
	w.Write(append(e.body(), '\n'))
}

// ErrorEvent is the SSE "error" event that ends a stream that failed after
// it started; body is the error in OpenAI's shape.
func ErrorEvent(body []byte) []byte {
	b := make([]byte, 0, 160)
	b = append(b, "event: error\ndata: "...)
	b = append(b, body...)
	return append(b, "\n\n"...)
}
