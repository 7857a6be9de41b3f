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
	tooLarge := &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
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
		return nil, &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error",
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
func parseOpenAI(body []byte) (requestMeta, []byte, error) {
	var b openAIBody
	if err := json.Unmarshal(body, &b); err != nil {
		return requestMeta{}, nil, badRequest("invalid_json", "request body is not valid JSON: "+jsonProblem(err))
	}
	m := requestMeta{Model: b.Model, Stream: b.Stream}
	if b.StreamOptions != nil && b.StreamOptions.IncludeUsage != nil {
		m.ClientUsage = *b.StreamOptions.IncludeUsage
	}
	switch {
	case b.MaxCompletionTokens != nil:
		m.OutputTokens = max(*b.MaxCompletionTokens, 0)
	case b.MaxTokens != nil:
		m.OutputTokens = max(*b.MaxTokens, 0)
	}
	var chars int
	for _, msg := range b.Messages {
		chars += len(msg.Content) + 16 // role and framing cost a few tokens
	}
	chars += len(b.Prompt) + len(b.Input)
	m.InputTokens = int64(chars+3) / 4
	if !m.Stream || m.ClientUsage {
		return m, body, nil
	}
	out, err := askForUsage(body, b.StreamOptions == nil)
	if err != nil {
		return requestMeta{}, nil, badRequest("invalid_json", "request body is not a JSON object")
	}
	return m, out, nil
}

func jsonProblem(err error) string {
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
