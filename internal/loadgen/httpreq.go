package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"time"
)

// doneGrace is how long the body may stay open after [DONE] (the trailers
// come after it) before the generator closes it.
const doneGrace = 2 * time.Second

// maxBody bounds a non-streamed response body.
const maxBody = 64 << 20

var doneData = []byte("[DONE]")

// httpRequester sends requests over HTTP/1.1, HTTP/2 or HTTP/3.
type httpRequester struct {
	url     string
	header  http.Header
	rt      http.RoundTripper
	closeFn func() error
}

func (h *httpRequester) close() error { return h.closeFn() }

func (h *httpRequester) do(ctx context.Context, j *job, res *Result) {
	// rctx also ends a response that stays open too long after [DONE].
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, h.url, bytes.NewReader(j.Body))
	if err != nil {
		res.Class, res.Err = ClassTransport, err.Error()
		return
	}
	req.Header = h.header.Clone()
	start := time.Now()
	resp, err := h.rt.RoundTrip(req)
	if err != nil {
		res.E2E = time.Since(start)
		res.Class, res.Err = classifyErr(ctx, err), errText(err)
		return
	}
	defer resp.Body.Close()
	res.Headers = time.Since(start)
	res.Status = resp.StatusCode
	res.RequestID = resp.Header.Get("X-Request-Id")
	res.Timing = ParseServerTiming(res.Timing, resp.Header.Values("Server-Timing")...)
	if cls := classifyStatus(resp.StatusCode); cls != ClassOK {
		res.Class, res.Err = cls, readErrorBody(resp.Body)
		res.E2E = time.Since(start)
		return
	}
	if isEventStream(resp.Header.Get("Content-Type")) {
		err = readStream(resp.Body, start, res, cancel)
		finishStream(ctx, err, start, res)
	} else {
		readWhole(ctx, resp.Body, start, res)
	}
	res.Timing = ParseServerTiming(res.Timing, resp.Trailer.Values("Server-Timing")...)
}

func isEventStream(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "text/event-stream"
}

// readErrorBody returns the error message of a non-2xx response.
func readErrorBody(body io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(body, 4<<10))
	if len(bytes.TrimSpace(b)) == 0 {
		return ""
	}
	var c chunk
	if _, err := c.parse(b); err == nil && c.hasError() {
		return errorMessage(c.errRaw)
	}
	return truncate(string(bytes.TrimSpace(b)), 200)
}

// streamState follows one stream's content events.
type streamState struct {
	res       *Result
	start     time.Time
	last      time.Time
	first     bool
	counted   int
	usageSeen bool
	c         chunk
}

// readStream reads SSE events from body until EOF or an error, recording
// arrivals into res. It returns the error that ended the stream (io.EOF for
// a clean end). abort, called doneGrace after [DONE], ends the response.
func readStream(body io.Reader, start time.Time, res *Result, abort func()) error {
	st := streamState{res: res, start: start}
	sr := newSSEReader(body)
	var grace *time.Timer
	defer func() {
		if grace != nil {
			grace.Stop()
		}
		st.settleTokens()
	}()
	for {
		kind, err := sr.next()
		now := time.Now()
		if err != nil {
			return err
		}
		if kind == sseTiming {
			res.Timing = ParseServerTiming(res.Timing, string(sr.comment))
			continue
		}
		res.Events++
		if res.Done || res.Class != ClassOK {
			continue // read on to EOF for the trailers
		}
		if bytes.Equal(sr.data, doneData) {
			res.Done, res.E2E = true, now.Sub(start)
			grace = time.AfterFunc(doneGrace, abort)
			continue
		}
		if err := st.event(now, sr.event, sr.data); err != nil {
			return err
		}
	}
}

// event handles one non-[DONE] event.
func (st *streamState) event(now time.Time, event, data []byte) error {
	if string(event) == "error" {
		st.streamError(now, data)
		return nil
	}
	n, err := st.c.parse(data)
	if err != nil {
		st.res.Class, st.res.Err = ClassProtocol, fmt.Sprintf("bad event %q: %v", truncate(string(data), 80), err)
		st.res.E2E = now.Sub(st.start)
		return errBadEvent
	}
	if st.c.hasError() {
		st.streamError(now, st.c.errRaw)
		return nil
	}
	if st.c.hasUsage {
		st.usageSeen, st.res.TokensOut = true, st.c.completionTokens
	}
	st.tokens(now, n)
	if n > 0 && st.c.hasEmit {
		st.res.TokenDelay = append(st.res.TokenDelay, time.Duration(now.UnixNano()-st.c.emitNs))
	}
	return nil
}

// errBadEvent stops reading a stream with a malformed event.
var errBadEvent = errors.New("malformed event")

func (st *streamState) tokens(now time.Time, n int) {
	if n == 0 {
		return
	}
	if !st.first {
		st.first, st.res.TTFT = true, now.Sub(st.start)
	} else {
		st.res.ITL = append(st.res.ITL, now.Sub(st.last))
	}
	st.last = now
	st.counted += n
}

func (st *streamState) streamError(now time.Time, data []byte) {
	st.res.Class, st.res.Err = ClassStreamError, errorMessage(data)
	st.res.E2E = now.Sub(st.start)
}

func (st *streamState) settleTokens() {
	if !st.usageSeen {
		st.res.TokensOut = st.counted
	}
}

// finishStream classifies how a stream ended: err is what stopped reading.
func finishStream(ctx context.Context, err error, start time.Time, res *Result) {
	if res.E2E == 0 {
		res.E2E = time.Since(start)
	}
	if res.Done || res.Class != ClassOK {
		return // complete, or already classified; errors after it don't matter
	}
	switch {
	case ctx.Err() != nil:
		res.Class, res.Err = classifyErr(ctx, err), "stream interrupted by the client"
	default:
		res.Class, res.Truncated = ClassTruncated, true
		res.Err = "stream ended without [DONE]"
		if !errors.Is(err, io.EOF) {
			res.Err += ": " + err.Error()
		}
	}
}

// readWhole reads a non-streamed response.
func readWhole(ctx context.Context, body io.Reader, start time.Time, res *Result) {
	b, err := io.ReadAll(io.LimitReader(body, maxBody))
	now := time.Now()
	res.E2E, res.TTFT = now.Sub(start), now.Sub(start)
	if err != nil {
		res.Class, res.Err = classifyErr(ctx, err), errText(err)
		if res.Class == ClassTransport {
			res.Class = ClassTruncated
			res.Truncated = true
		}
		return
	}
	res.Events, res.Done = 1, true
	var c chunk
	n, err := c.parse(b)
	switch {
	case err != nil:
		res.Class, res.Err = ClassProtocol, fmt.Sprintf("bad body: %v", err)
	case c.hasError():
		res.Class, res.Err = ClassStreamError, errorMessage(c.errRaw)
	case c.hasUsage:
		res.TokensOut = c.completionTokens
	default:
		res.TokensOut = n
	}
}
