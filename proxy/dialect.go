package proxy

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/limiter"
)

// dialect is the API a request on an openai route speaks, chosen from the
// request path's suffix (dialectOf): it decides how the request's fields
// are read, how each stream event is classified (tokens, usage, end) and
// in which shape errors are answered.
//
// Shapes followed (versions named so the fixtures can be checked):
//   - chat completions and legacy completions: OpenAI API reference and
//     vLLM v0.11 vllm/entrypoints/openai/protocol.py (one choice per chunk
//     when n > 1; tool_calls[].function.arguments, reasoning_content and
//     reasoning deltas);
//   - Responses: openai-python v1.109 types/responses/response_stream_event.py
//     and vLLM v0.11 serving_responses.py ("event: <type>" lines, usage in
//     response.completed as input_tokens/output_tokens, error event
//     {"type":"error","code","message","param","sequence_number"});
//   - Messages: anthropic-sdk-typescript v0.65 src/core/streaming.ts and
//     resources/messages (message_start usage.input_tokens,
//     content_block_delta text_delta/input_json_delta/thinking_delta,
//     message_delta usage.output_tokens, message_stop, "event: error" with
//     {"type":"error","error":{"type","message"}}) and vLLM v0.11
//     vllm/entrypoints/anthropic/.
type dialect uint8

const (
	dialectChat dialect = iota
	dialectCompletions
	dialectResponses
	dialectMessages
)

// dialectOf picks the dialect from the path: .../responses, .../messages
// and .../completions (not chat/completions); anything else is chat.
func dialectOf(path string) dialect {
	path = strings.TrimSuffix(path, "/")
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return dialectChat
	case strings.HasSuffix(path, "/completions"):
		return dialectCompletions
	case strings.HasSuffix(path, "/responses"):
		return dialectResponses
	case strings.HasSuffix(path, "/messages"):
		return dialectMessages
	}
	return dialectChat
}

// eventKind is what an event means to the relay.
type eventKind uint8

const (
	eventOther     eventKind = iota // pass on, nothing to count
	eventToken                      // one generated token (delta) per event
	eventUsage                      // carries usage (x.usage updated)
	eventUsageDrop                  // usage-only chat chunk the client did not ask for
	eventEnd                        // the stream's normal last event
	eventFailed                     // the backend's own error/failed last event
)

var (
	// chat/completions delta members whose non-empty string is a token.
	chatTokenKeys = [][]byte{[]byte(`"content"`), []byte(`"text"`), []byte(`"reasoning_content"`),
		[]byte(`"reasoning"`), []byte(`"arguments"`)}
	deltaKey        = [][]byte{[]byte(`"delta"`)}
	messageDeltaKey = [][]byte{[]byte(`"text"`), []byte(`"partial_json"`), []byte(`"thinking"`)}
	eventPrefix     = []byte("event:")
)

// classify reads one event of a committed stream. The rule for tokens: an
// event carrying a non-empty delta string (text, tool-call arguments or
// reasoning) counts as one token; a chat chunk carries one choice (vLLM
// sends one chunk per choice when n > 1), so n choices count n tokens per
// step. Usage found is stored in x.usage. Classification scans bytes: no
// event is unmarshalled.
func (x *exchange) classify(ev, data []byte) eventKind {
	switch x.dialect {
	case dialectResponses:
		return x.classifyResponses(ev, data)
	case dialectMessages:
		return x.classifyMessages(ev, data)
	}
	if bytes.Equal(data, doneMarker) {
		return eventEnd
	}
	if u, usageOnly := usageOf(data); u != nil {
		x.usage = u
		if usageOnly && !x.meta.ClientUsage {
			return eventUsageDrop
		}
		if !usageOnly && hasString(data, chatTokenKeys) {
			return eventToken // the last chunk may carry both
		}
		return eventUsage
	}
	if hasString(data, chatTokenKeys) {
		return eventToken
	}
	return eventOther
}

// endsStream reports whether ev is its stream's last event, as classify
// would find it (eventEnd or eventFailed), without classify's side effects
// (usage): the hand-off leaves such an event to the loop (relayBuffered).
func (x *exchange) endsStream(ev, data []byte) bool {
	switch x.dialect {
	case dialectResponses:
		switch string(eventName(ev, data)) {
		case "response.completed", "response.incomplete", "response.failed", "error":
			return true
		}
		return false
	case dialectMessages:
		switch string(eventName(ev, data)) {
		case "message_stop", "error":
			return true
		}
		return false
	}
	return bytes.Equal(data, doneMarker)
}

func (x *exchange) classifyResponses(ev, data []byte) eventKind {
	name := eventName(ev, data)
	switch {
	case bytes.HasSuffix(name, []byte(".delta")):
		if bytes.HasPrefix(name, []byte("response.")) && !bytes.HasPrefix(name, []byte("response.audio")) &&
			hasString(data, deltaKey) {
			return eventToken
		}
	case string(name) == "response.completed" || string(name) == "response.incomplete":
		x.readUsage(data)
		return eventEnd
	case string(name) == "response.failed" || string(name) == "error":
		x.readUsage(data)
		return eventFailed
	}
	return eventOther
}

func (x *exchange) classifyMessages(ev, data []byte) eventKind {
	switch name := eventName(ev, data); string(name) {
	case "content_block_delta":
		if hasString(data, messageDeltaKey) {
			return eventToken
		}
	case "message_start", "message_delta":
		if x.readUsage(data) {
			return eventUsage
		}
	case "message_stop":
		return eventEnd
	case "error":
		return eventFailed
	}
	return eventOther
}

// eventName is the event's "event:" field, else its data's first "type"
// string (a backend that sends no event lines).
func eventName(ev, data []byte) []byte {
	if bytes.HasPrefix(ev, eventPrefix) {
		line := ev[len(eventPrefix):]
		if i := bytes.IndexByte(line, '\n'); i >= 0 {
			line = line[:i]
		}
		return bytes.TrimSpace(line)
	}
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return nil
	}
	var name []byte
	scanObject(data, i, 1, func(key []byte, v int) int {
		end := skipValue(data, v, 1)
		if name == nil && string(key) == `"type"` && data[v] == '"' && end > v+1 {
			name = data[v+1 : end-1]
		}
		return end
	})
	return name
}

// hasString reports whether data has one of keys (quoted member names)
// followed by ':' and a non-empty string, JSON white space allowed around
// the colon.
func hasString(data []byte, keys [][]byte) bool {
	for _, key := range keys {
		off := 0
		for n := 0; n < 64; n++ { // bounded: a chunk has few members
			i := bytes.Index(data[off:], key)
			if i < 0 {
				break
			}
			off += i + len(key)
			j := skipSpace(data, off)
			if j >= len(data) || data[j] != ':' {
				continue
			}
			k := skipSpace(data, j+1)
			if k+1 < len(data) && data[k] == '"' && data[k+1] != '"' {
				return true
			}
		}
	}
	return false
}

// usageTokenNames: input and output in turn, then Anthropic's prompt-cache
// counts, which its input_tokens leaves out (Messages API "usage":
// input_tokens + cache_creation_input_tokens + cache_read_input_tokens is
// the whole prompt; OpenAI's cached_tokens is a detail already inside
// prompt_tokens/input_tokens).
var usageTokenNames = []string{"input_tokens", "output_tokens", "prompt_tokens", "completion_tokens",
	"cache_creation_input_tokens", "cache_read_input_tokens"}

var (
	responsePath = []string{"response"}
	messagePath  = []string{"message"}
)

// readUsage reads the usage object of a Responses or Messages event into
// x.usage: response.usage (response.completed and the like), message.usage
// (message_start: the input), or the top-level usage (message_delta: the
// cumulative output). It walks the event's members rather than searching
// for the bytes "usage": a request's echoed tools, schema or metadata must
// not pass for the backend's report. Once or twice a stream.
func (x *exchange) readUsage(data []byte) bool {
	v := memberAt(data, skipSpace(data, 0), responsePath, 1)
	if v < 0 {
		v = memberAt(data, skipSpace(data, 0), messagePath, 1)
	}
	if v < 0 {
		v = skipSpace(data, 0)
	}
	u := memberAt(data, v, []string{"usage"}, 2)
	if u < 0 || data[u] != '{' {
		return false
	}
	var in, cached, out int64
	var hasIn, hasOut bool
	end := scanObject(data, u, 3, func(key []byte, v int) int {
		idx, _ := fieldIndex(key, usageTokenNames)
		if idx < 0 || data[v] == 'n' {
			return skipValue(data, v, 3)
		}
		n, end := intNumber(data, v)
		switch {
		case idx >= 4:
			cached += n
		case idx%2 == 0:
			in, hasIn = n, true
		default:
			out, hasOut = n, true
		}
		return end
	})
	if end < 0 || (!hasIn && !hasOut) {
		return false
	}
	if x.usage == nil {
		x.usage = &limiter.Usage{InputTokens: x.meta.InputTokens}
	}
	if hasIn {
		x.usage.InputTokens = in + cached
	}
	if hasOut {
		x.usage.OutputTokens = out
	}
	return true
}

// memberAt returns the index of the value of the object at data[i]'s
// member named name[0] (the last one when repeated), or -1.
func memberAt(data []byte, i int, name []string, depth int) int {
	if i >= len(data) || data[i] != '{' {
		return -1
	}
	at := -1
	end := scanObject(data, i, depth, func(key []byte, v int) int {
		if exact, _ := fieldIndex(key, name); exact == 0 {
			at = v
		}
		return skipValue(data, v, depth)
	})
	if end < 0 {
		return -1
	}
	return at
}

// errorBody is e as the dialect's non-streamed error body.
func (x *exchange) errorBody(e *APIError) []byte {
	if x.dialect == dialectMessages {
		return anthropicError(e.Status, e.Message)
	}
	return e.body()
}

// streamErrorBody is e as the data of the dialect's mid-stream error event
// (sent as "event: error").
func (x *exchange) streamErrorBody(e *APIError) []byte {
	switch x.dialect {
	case dialectMessages:
		return anthropicError(e.Status, e.Message)
	case dialectResponses:
		b, _ := json.Marshal(struct {
			Type    string  `json:"type"`
			Code    string  `json:"code"`
			Message string  `json:"message"`
			Param   *string `json:"param"`
		}{"error", e.Code, e.Message, nil})
		return b
	}
	return e.body()
}

// anthropicError is Anthropic's error body for status.
func anthropicError(status int, msg string) []byte {
	var t string
	switch status {
	case 400:
		t = "invalid_request_error"
	case 401:
		t = "authentication_error"
	case 403:
		t = "permission_error"
	case 404:
		t = "not_found_error"
	case 413:
		t = "request_too_large"
	case 429:
		t = "rate_limit_error"
	case 503, 529:
		t = "overloaded_error"
	case 504:
		t = "timeout_error"
	default:
		t = "api_error"
	}
	type inner struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}
	b, _ := json.Marshal(struct {
		Type  string `json:"type"`
		Error inner  `json:"error"`
	}{"error", inner{t, msg}})
	return b
}

// refusalBody is a limiter refusal's body in the dialect's shape.
func (x *exchange) refusalBody(d limiter.Decision) []byte {
	b := limiter.ErrorBody(d)
	if x.dialect != dialectMessages {
		return b
	}
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	json.Unmarshal(b, &e)
	return anthropicError(limiter.StatusCode(d), e.Error.Message)
}

// setAnthropicHeaders adds Anthropic's rate-limit headers on /v1/messages
// (anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-
// {limit,remaining,reset}, reset as an RFC 3339 time), beside the OpenAI
// ones limiter.SetHeaders wrote.
func setAnthropicHeaders(h http.Header, d limiter.Decision, now time.Time) {
	for _, q := range []struct {
		name string
		q    limiter.Quota
	}{{"requests", d.Requests}, {"tokens", d.Tokens}, {"input-tokens", d.InputTokens}, {"output-tokens", d.OutputTokens}} {
		if q.q.Limit == 0 {
			continue
		}
		p := "anthropic-ratelimit-" + q.name
		h.Set(p+"-limit", strconv.FormatInt(q.q.Limit, 10))
		h.Set(p+"-remaining", strconv.FormatInt(max(q.q.Remaining, 0), 10))
		h.Set(p+"-reset", now.Add(q.q.Reset).UTC().Format(time.RFC3339))
	}
}

// isToken reports whether a chat or completions chunk carries generated
// output: a non-empty content, text, reasoning_content, reasoning or
// tool-call arguments string.
func isToken(data []byte) bool { return hasString(data, chatTokenKeys) }
