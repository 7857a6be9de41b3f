package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
)

// requestMeta is what the pipeline needs from an OpenAI request body.
type requestMeta struct {
	Model string
	// Stream is the request's "stream" flag.
	Stream bool
	// ClientUsage is set when the client asked for the usage chunk
	// (stream_options.include_usage).
	ClientUsage bool
	// InputTokens is an estimate of the prompt's size in tokens.
	InputTokens int64
	// OutputTokens is max_completion_tokens or max_tokens, zero if absent.
	OutputTokens int64
	// N is the number of choices asked for (n), 1 when absent.
	N int64
}

type openAIBody struct {
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	StreamOptions *struct {
		IncludeUsage *bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens           *int64 `json:"max_tokens"`
	MaxCompletionTokens *int64 `json:"max_completion_tokens"`
	Messages            []struct {
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Prompt json.RawMessage `json:"prompt"`
	Input  json.RawMessage `json:"input"`
}

// readBody reads the request body, at most limit bytes (413 beyond).
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	tooLarge := &APIError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
		Code: "request_too_large", Message: fmt.Sprintf("request body exceeds %d bytes", limit)}
	if r.ContentLength > limit {
		return nil, tooLarge
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength))
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return nil, tooLarge
	case err != nil:
		return nil, &APIError{Status: http.StatusBadRequest, Type: "invalid_request_error",
			Code: "body_read_error", Message: "could not read the request body"}
	}
	return buf.Bytes(), nil
}

// isJSON reports whether a request declares a JSON body (or none).
func isJSON(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || mt == "text/plain")
}

// parseOpenAI reads the fields the pipeline needs and, for a stream whose
// client did not ask for usage, returns a body that asks the backend for it.
// The body is scanned once, without decoding it; what the scan leaves (an
// invalid body, a field of the wrong type, a repeated messages array) is
// decoded by encoding/json, whose result the scan matches (FuzzParseOpenAI)
// and whose errors name the problem.
func parseOpenAI(body []byte) (requestMeta, []byte, error) {
	var f openAIFields
	if !f.scan(body) {
		if err := f.decode(body); err != nil {
			return requestMeta{}, nil, badRequest("invalid_json", "request body is not valid JSON: "+JSONProblem(err))
		}
	}
	m := requestMeta{Model: f.model, Stream: f.stream, ClientUsage: f.options && f.includeUsage}
	switch {
	case f.hasMaxCompletion:
		m.OutputTokens = max(f.maxCompletion, 0)
	case f.hasMaxTokens:
		m.OutputTokens = max(f.maxTokens, 0)
	}
	m.InputTokens = int64(f.chars+f.prompt+f.input+3) / 4
	if !m.Stream || m.ClientUsage {
		return m, body, nil
	}
	out, err := askForUsage(body, !f.options)
	if err != nil {
		return requestMeta{}, nil, badRequest("invalid_json", "request body is not a JSON object")
	}
	return m, out, nil
}

// openAIFields is what parseOpenAI uses of openAIBody, as json.Unmarshal
// leaves it.
type openAIFields struct {
	model  string
	stream bool
	// options is set when stream_options is an object (the pointer is
	// not nil: null and absent are alike).
	options      bool
	includeUsage bool
	maxTokens    int64
	hasMaxTokens bool
	// maxCompletion is max_completion_tokens.
	maxCompletion    int64
	hasMaxCompletion bool
	// messages is the length of the messages slice; chars is the length
	// of their raw contents plus 16 each (role and framing cost a few
	// tokens).
	messages int
	chars    int
	// prompt and input are the lengths of the raw values.
	prompt, input int
}

// decode is json.Unmarshal into openAIBody.
func (f *openAIFields) decode(body []byte) error {
	var b openAIBody
	if err := json.Unmarshal(body, &b); err != nil {
		return err
	}
	*f = openAIFields{model: b.Model, stream: b.Stream, options: b.StreamOptions != nil,
		messages: len(b.Messages), prompt: len(b.Prompt), input: len(b.Input)}
	if b.StreamOptions != nil && b.StreamOptions.IncludeUsage != nil {
		f.includeUsage = *b.StreamOptions.IncludeUsage
	}
	if b.MaxTokens != nil {
		f.maxTokens, f.hasMaxTokens = *b.MaxTokens, true
	}
	if b.MaxCompletionTokens != nil {
		f.maxCompletion, f.hasMaxCompletion = *b.MaxCompletionTokens, true
	}
	for _, msg := range b.Messages {
		f.chars += len(msg.Content) + 16
	}
	return nil
}

// The members of openAIBody, in openAINames's order.
const (
	fieldModel = iota
	fieldStream
	fieldStreamOptions
	fieldMaxTokens
	fieldMaxCompletion
	fieldMessages
	fieldPrompt
	fieldInput
)

var openAINames = []string{"model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "messages", "prompt", "input"}

// scan reads body in one pass, checking as it goes that it is valid JSON.
// It sets f as json.Unmarshal into openAIBody would: names matched without
// case, later members over earlier ones, null leaving a value (and
// clearing a pointer or slice). It reports false when body is not valid,
// when a field has the wrong type, and for a non-empty "messages" array
// after another: encoding/json decodes that into the earlier elements,
// keeping contents the new ones lack, which is left to decode.
func (f *openAIFields) scan(body []byte) bool {
	i := skipSpace(body, 0)
	if i < len(body) && body[i] == 'n' { // null leaves the struct as is
		end := literalEnd(body, i, "null")
		return end > 0 && skipSpace(body, end) == len(body)
	}
	if i >= len(body) || body[i] != '{' {
		return false // invalid, or not an object (a wrong type)
	}
	var model []byte // the last model string, as written
	end := scanObject(body, i, 1, func(key []byte, v int) int {
		switch fieldIndex(key, openAINames) {
		case fieldModel:
			switch body[v] {
			case '"':
				end := stringValid(body, v)
				if end > 0 {
					model = body[v:end]
				}
				return end
			case 'n':
				return literalEnd(body, v, "null")
			}
		case fieldStream:
			return boolValue(body, v, &f.stream)
		case fieldStreamOptions:
			return f.scanOptions(body, v)
		case fieldMaxTokens:
			return intValue(body, v, &f.maxTokens, &f.hasMaxTokens)
		case fieldMaxCompletion:
			return intValue(body, v, &f.maxCompletion, &f.hasMaxCompletion)
		case fieldMessages:
			return f.scanMessages(body, v)
		case fieldPrompt:
			end := skipValue(body, v, 1)
			f.prompt = end - v
			return end
		case fieldInput:
			end := skipValue(body, v, 1)
			f.input = end - v
			return end
		default:
			return skipValue(body, v, 1)
		}
		return -1 // the wrong type
	})
	if end < 0 || skipSpace(body, end) != len(body) {
		return false
	}
	if model != nil {
		f.model = unquote(model)
	}
	return true
}

// scanOptions reads the stream_options value at body[v].
func (f *openAIFields) scanOptions(body []byte, v int) int {
	switch body[v] {
	case 'n':
		f.options, f.includeUsage = false, false
		return literalEnd(body, v, "null")
	case '{':
		if !f.options { // a repeated object is decoded into the first
			f.options, f.includeUsage = true, false
		}
		return scanObject(body, v, 2, func(key []byte, v int) int {
			if fieldIndex(key, []string{"include_usage"}) < 0 {
				return skipValue(body, v, 2)
			}
			if body[v] == 'n' { // a nil *bool
				f.includeUsage = false
				return literalEnd(body, v, "null")
			}
			return boolValue(body, v, &f.includeUsage)
		})
	}
	return -1
}

// scanMessages reads the messages value at body[v].
func (f *openAIFields) scanMessages(body []byte, v int) int {
	switch body[v] {
	case 'n':
		f.messages, f.chars = 0, 0
		return literalEnd(body, v, "null")
	case '[':
		if f.messages > 0 {
			if i := skipSpace(body, v+1); i >= len(body) || body[i] != ']' {
				return -1 // merged into the earlier elements: see scan
			}
		}
		f.messages, f.chars = 0, 0
		return scanArray(body, v, 2, func(e int) int {
			f.messages++
			f.chars += 16
			switch body[e] {
			case 'n': // a new element stays zero
				return literalEnd(body, e, "null")
			case '{':
				content := 0
				end := scanObject(body, e, 3, func(key []byte, v int) int {
					end := skipValue(body, v, 3)
					if fieldIndex(key, []string{"content"}) == 0 {
						content = end - v
					}
					return end
				})
				f.chars += content
				return end
			}
			return -1
		})
	}
	return -1
}

// boolValue reads a bool at body[v] into b; null leaves b.
func boolValue(body []byte, v int, b *bool) int {
	switch body[v] {
	case 't':
		*b = true
		return literalEnd(body, v, "true")
	case 'f':
		*b = false
		return literalEnd(body, v, "false")
	case 'n':
		return literalEnd(body, v, "null")
	}
	return -1
}

// intValue reads an *int64 at body[v]: null clears it; a number must be an
// integer in range, as encoding/json reads it (strconv.ParseInt).
func intValue(body []byte, v int, n *int64, set *bool) int {
	if body[v] == 'n' {
		*n, *set = 0, false
		return literalEnd(body, v, "null")
	}
	x, end := intNumber(body, v)
	if end >= 0 {
		*n, *set = x, true
	}
	return end
}

// JSONProblem describes a JSON decoding error for a client: the syntax
// error and its byte offset, or the field with the wrong type.
func JSONProblem(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("%v (at byte %d)", se, se.Offset)
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("field %q has the wrong type (%s)", te.Field, te.Value)
	}
	return err.Error()
}

// askForUsage sets stream_options.include_usage to true. When the body has
// no stream_options it splices the field in after the opening brace, which
// keeps the client's body byte for byte otherwise.
func askForUsage(body []byte, noOptions bool) ([]byte, error) {
	const field = `"stream_options":{"include_usage":true},`
	if noOptions {
		i := bytes.IndexByte(body, '{')
		if i < 0 {
			return nil, errors.New("not an object")
		}
		out := make([]byte, 0, len(body)+len(field))
		out = append(out, body[:i+1]...)
		out = append(out, field...)
		return append(out, body[i+1:]...), nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		return nil, err
	}
	var opts map[string]json.RawMessage
	if err := json.Unmarshal(obj["stream_options"], &opts); err != nil || opts == nil {
		opts = map[string]json.RawMessage{}
	}
	opts["include_usage"] = json.RawMessage("true")
	raw, _ := json.Marshal(opts)
	obj["stream_options"] = raw
	return json.Marshal(obj)
}

// discard drains at most n bytes so the connection can be reused.
func discard(r io.Reader, n int64) { io.Copy(io.Discard, io.LimitReader(r, n)) }
