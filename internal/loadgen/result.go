package loadgen

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"time"
)

// ErrorClass says how a request ended. The empty class is success.
type ErrorClass string

// Error classes.
const (
	ClassOK          ErrorClass = ""
	ClassHTTP429     ErrorClass = "http_429"     // rate limited
	ClassHTTP4xx     ErrorClass = "http_4xx"     // other 4xx
	ClassHTTP5xx     ErrorClass = "http_5xx"     // 5xx
	ClassHTTPOther   ErrorClass = "http_other"   // 1xx/3xx final status
	ClassConnect     ErrorClass = "connect"      // dial failed
	ClassTLS         ErrorClass = "tls"          // handshake or verification failed
	ClassTransport   ErrorClass = "transport"    // other error before the response
	ClassProtocol    ErrorClass = "protocol"     // malformed stream or body
	ClassStreamError ErrorClass = "stream_error" // explicit error event in a 2xx stream
	ClassTruncated   ErrorClass = "truncated"    // stream ended without [DONE] or error event
	ClassTimeout     ErrorClass = "timeout"      // Config.Timeout expired
	ClassCanceled    ErrorClass = "canceled"     // the run was cancelled or its drain expired
	ClassDropped     ErrorClass = "dropped"      // open loop over MaxInFlight: never sent
)

// Result is the record of one request.
type Result struct {
	// Target is 0 for Config.Target, 1 for Config.Compare.
	Target int
	// Seq is the workload sequence number (same seq, same request body).
	Seq int64
	// Warmup marks requests started during the warm-up (not reported).
	Warmup bool
	// Start is when the request was sent, from the start of its phase.
	Start time.Duration
	// Lag is, in an open loop, how late the request was sent after its
	// scheduled arrival (a generator health figure).
	Lag time.Duration
	// PromptTokens and MaxTokens are what the workload asked for.
	PromptTokens, MaxTokens int
	// Status is the HTTP status (or the WebSocket error frame's status; 200
	// for a WebSocket stream). Zero when no response arrived.
	Status int
	// Class is how the request ended; ClassOK is success.
	Class ErrorClass
	// Truncated is true when a stream whose 2xx response headers had
	// arrived ended without [DONE] and without an explicit error event
	// (Class is then ClassTruncated). A connection lost before the headers
	// is an error, not a truncation; note that a QUIC stream reset may
	// discard headers the client had not read yet.
	Truncated bool
	// Done is true when the stream ended with [DONE] (or a done frame).
	Done bool
	// Headers is the time to the response headers (zero for WebSocket).
	Headers time.Duration
	// TTFT is the time to the first content event; zero when none came.
	TTFT time.Duration
	// E2E is the time to [DONE] (or the end of the response).
	E2E time.Duration
	// ITL holds the gaps between consecutive content events.
	ITL []time.Duration
	// TokenDelay holds, for each content event that carried EmitField,
	// its arrival time minus that emit time (both Unix wall-clock
	// nanoseconds, so only meaningful when the backend runs on the same
	// host): how long the token took from the backend's write to the
	// generator. Empty when the backend does not stamp its chunks.
	TokenDelay []time.Duration
	// TokensOut is usage.completion_tokens if reported, else the number of
	// content-bearing choices received.
	TokensOut int
	// Events is the number of SSE events (or WebSocket frames) received.
	Events int
	// RequestID is the X-Request-Id response header, for finding the
	// request in the proxy's access log; empty when absent.
	RequestID string
	// Timing is the Server-Timing metrics from the response headers,
	// trailers, SSE comment lines or the WebSocket done frame, in order.
	Timing []Metric
	// Err describes the failure; empty on success.
	Err string
}

// errRequestTimeout is the cancellation cause of a request whose
// Config.Timeout expired.
var errRequestTimeout = errors.New("request timeout")

// classifyErr maps a transport error of a request run under ctx to a class.
func classifyErr(ctx context.Context, err error) ErrorClass {
	if ctx.Err() != nil {
		if errors.Is(context.Cause(ctx), errRequestTimeout) {
			return ClassTimeout
		}
		return ClassCanceled
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return ClassTimeout
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return ClassConnect
	}
	var recErr tls.RecordHeaderError
	var verErr *tls.CertificateVerificationError
	var alert tls.AlertError
	if errors.As(err, &recErr) || errors.As(err, &verErr) || errors.As(err, &alert) || errors.Is(err, errPinMismatch) {
		return ClassTLS
	}
	return ClassTransport
}

// classifyStatus maps a non-2xx HTTP status to a class.
func classifyStatus(code int) ErrorClass {
	switch {
	case code >= 200 && code < 300:
		return ClassOK
	case code == 429:
		return ClassHTTP429
	case code >= 400 && code < 500:
		return ClassHTTP4xx
	case code >= 500:
		return ClassHTTP5xx
	}
	return ClassHTTPOther
}
