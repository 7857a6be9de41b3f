package bridge

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluice-proxy/sluice/proxy"
)

// Frame types of the bridge protocol (docs/WEBSOCKET.md).
const (
	frameRequest = "request"
	frameCancel  = "cancel"
	frameChunk   = "chunk"
	frameDone    = "done"
	frameError   = "error"
)

const maxFrameID = 128

// clientFrame is a frame from the client.
type clientFrame struct {
	Type   string          `json:"type"`
	ID     string          `json:"id"`
	Method string          `json:"method"`
	Path   string          `json:"path"`
	Body   json.RawMessage `json:"body"`

	url *url.URL // the parsed path
}

// parseClientFrame decodes and checks a client frame. On error the returned
// frame still carries the id when one could be read, so the error frame can
// name the request it is about.
func parseClientFrame(msg []byte, bridgePath string) (clientFrame, *proxy.APIError) {
	var f clientFrame
	if err := json.Unmarshal(msg, &f); err != nil {
		var id struct {
			ID string `json:"id"`
		}
		json.Unmarshal(msg, &id)
		f = clientFrame{ID: validFrameID(id.ID)}
		return f, badFrame("frame is not valid JSON: " + proxy.JSONProblem(err))
	}
	if f.ID == "" {
		return f, badFrame(`frame needs a non-empty "id"`)
	}
	if validFrameID(f.ID) == "" {
		f.ID = ""
		return f, badFrame(`"id" must be at most 128 bytes`)
	}
	switch f.Type {
	case frameCancel:
		return f, nil
	case frameRequest:
	case "":
		return f, badFrame(`frame needs a "type" ("request" or "cancel")`)
	default:
		return f, badFrame("unknown frame type " + strconv.Quote(f.Type) + ` (want "request" or "cancel")`)
	}
	return f, checkRequestFrame(&f, bridgePath)
}

// checkRequestFrame checks a request frame's method, path and body, and
// parses its path.
func checkRequestFrame(f *clientFrame, bridgePath string) *proxy.APIError {
	switch f.Method {
	case "":
		f.Method = http.MethodPost
	case http.MethodPost, http.MethodGet:
	default:
		return badFrame(`"method" must be POST or GET`)
	}
	if f.Path == "" {
		return badFrame(`request frame needs a "path", e.g. "/v1/chat/completions"`)
	}
	u, err := url.ParseRequestURI(f.Path)
	if err != nil || u.Host != "" || u.Scheme != "" || !strings.HasPrefix(f.Path, "/") ||
		strings.HasPrefix(f.Path, "//") || len(f.Path) > 2048 {
		return badFrame(`"path" must be an absolute path such as "/v1/chat/completions"`)
	}
	f.url = u
	if u.Path == bridgePath {
		return badFrame(`"path" cannot be the WebSocket endpoint itself`)
	}
	if f.Method == http.MethodPost && (len(f.Body) == 0 || f.Body[0] != '{') {
		return badFrame(`request frame needs a JSON object "body"`)
	}
	return nil
}

func validFrameID(id string) string {
	if len(id) > maxFrameID {
		return ""
	}
	return id
}

func badFrame(msg string) *proxy.APIError {
	return &proxy.APIError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_frame", Message: msg}
}

// framePool recycles frame buffers; the writer returns each after writing.
var framePool = sync.Pool{New: func() any { b := make([]byte, 0, 1<<10); return &b }}

func getFrame() *[]byte { return framePool.Get().(*[]byte) }

func putFrame(b *[]byte) {
	if cap(*b) > 64<<10 {
		return // keep the pool's memory small
	}
	*b = (*b)[:0]
	framePool.Put(b)
}

// chunkPrefix is the start of a request's chunk frames, up to the data.
func chunkPrefix(id string) []byte {
	q, _ := json.Marshal(id)
	b := make([]byte, 0, 40+len(q))
	b = append(b, `{"type":"chunk","id":`...)
	b = append(b, q...)
	return append(b, `,"data":`...)
}

// appendChunk appends a chunk frame to dst: prefix, the event name when it
// is not the default, and data embedded as JSON when it is valid JSON, else
// as a JSON string.
func appendChunk(dst, prefix []byte, event string, data []byte) []byte {
	if event != "" && event != "message" {
		dst = append(dst, prefix[:len(prefix)-len(`"data":`)]...)
		q, _ := json.Marshal(event)
		dst = append(dst, `"event":`...)
		dst = append(dst, q...)
		dst = append(dst, `,"data":`...)
	} else {
		dst = append(dst, prefix...)
	}
	if json.Valid(data) {
		dst = append(dst, data...)
	} else {
		q, _ := json.Marshal(string(data))
		dst = append(dst, q...)
	}
	return append(dst, '}')
}

// usageJSON is OpenAI's usage object.
type usageJSON struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

type doneFrame struct {
	Type      string          `json:"type"`
	ID        string          `json:"id"`
	RequestID string          `json:"request_id,omitempty"`
	Usage     *usageJSON      `json:"usage"`
	Timing    json.RawMessage `json:"timing"`
}

type errorFrame struct {
	Type         string          `json:"type"`
	ID           string          `json:"id,omitempty"`
	RequestID    string          `json:"request_id,omitempty"`
	Status       int             `json:"status"`
	Error        json.RawMessage `json:"error"`
	RetryAfterMs int64           `json:"retry_after_ms,omitempty"`
}

// newDoneFrame builds the done frame from the pipeline's outcome.
func newDoneFrame(id string, o *proxy.Outcome) []byte {
	f := doneFrame{Type: frameDone, ID: id, RequestID: o.RequestID}
	if o.Usage != nil {
		f.Usage = &usageJSON{PromptTokens: o.Usage.InputTokens, CompletionTokens: o.Usage.OutputTokens,
			TotalTokens: o.Usage.InputTokens + o.Usage.OutputTokens}
	}
	f.Timing = o.Timing
	b, _ := json.Marshal(f)
	return b
}

// newErrorFrame builds an error frame for e; id and requestID may be empty.
func newErrorFrame(id, RequestID string, e *proxy.APIError) []byte {
	f := errorFrame{Type: frameError, ID: id, RequestID: RequestID, Status: e.Status,
		Error: e.Object()}
	if e.RetryAfter > 0 {
		f.RetryAfterMs = int64(e.RetryAfter) * 1000
	}
	b, _ := json.Marshal(f)
	return b
}

// newErrorFrameRaw builds an error frame from a response the pipeline
// wrote: its status, headers and (OpenAI-shaped) body.
func newErrorFrameRaw(id, RequestID string, status int, h http.Header, body []byte, retryAfter time.Duration) []byte {
	f := errorFrame{Type: frameError, ID: id, RequestID: RequestID, Status: status}
	var eb struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(body, &eb) == nil && len(eb.Error) > 0 && eb.Error[0] == '{' {
		f.Error = eb.Error
	} else {
		msg := strings.TrimSpace(string(body))
		if msg == "" {
			msg = http.StatusText(status)
		}
		f.Error = (&proxy.APIError{Message: msg, Type: "server_error", Code: "upstream_error"}).Object()
	}
	f.RetryAfterMs = retryAfterMs(h, retryAfter)
	b, _ := json.Marshal(f)
	return b
}

// retryAfterMs prefers the limiter's exact figure, then the retry-after-ms
// and Retry-After (seconds) headers.
func retryAfterMs(h http.Header, exact time.Duration) int64 {
	if exact > 0 {
		return (exact + time.Millisecond - 1).Milliseconds()
	}
	if v, err := strconv.ParseInt(h.Get("Retry-After-Ms"), 10, 64); err == nil && v > 0 {
		return v
	}
	if v, err := strconv.ParseInt(h.Get("Retry-After"), 10, 64); err == nil && v > 0 {
		return v * 1000
	}
	return 0
}
