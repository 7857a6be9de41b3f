package gpusim

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// maxBodyBytes bounds a request body.
const maxBodyBytes = 16 << 20

// genRequest is the part of a chat or completion request the simulator
// reads. Unknown fields are ignored.
type genRequest struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stop                json.RawMessage `json:"stop"`
	N                   *int            `json:"n"`
	// Tools: a chat request naming tools gets its output as a call of the
	// first one, streamed as tool_calls[0].function.arguments deltas.
	Tools []struct {
		Name     string `json:"name"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
	// Responses API
	Input           json.RawMessage `json:"input"`
	Instructions    json.RawMessage `json:"instructions"`
	MaxOutputTokens *int            `json:"max_output_tokens"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// job is a validated generation request.
type job struct {
	api          api
	chat         bool // chat completions or Messages: the prompt is messages
	stream       bool
	includeUsage bool
	prompt       int      // prompt tokens
	blocks       []uint64 // the prompt's chained block hashes (prefix cache on)
	cached       int      // prompt tokens found in the prefix cache
	limit        int      // completion tokens delivered
	finish       string   // finish_reason: "length" or "stop"
	seed         uint64   // token stream seed
	id           string
	created      int64
	tool         string // chat: the tool called (tool_calls deltas), or ""
	reasoning    int    // the first tokens sent as reasoning
}

// readJSON reads a bounded request body into v.
func readJSON(w http.ResponseWriter, r *http.Request, v any) *apiError {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return errTooLarge(maxBodyBytes)
		}
		return badRequest("invalid_body", "reading the request body: %v", err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return errInvalidJSON(err)
	}
	return nil
}

// parseGenerate reads and validates a chat (chat true) or completion
// request.
func (s *Sim) parseGenerate(w http.ResponseWriter, r *http.Request, a api) (*job, *apiError) {
	chat := a == apiChat || a == apiMessages
	var req genRequest
	if e := readJSON(w, r, &req); e != nil {
		return nil, e
	}
	if req.Model != "" && req.Model != s.cfg.Model {
		return nil, errUnknownModel(req.Model)
	}
	if req.N != nil && *req.N != 1 {
		return nil, badRequest("invalid_value", "n must be 1 (the simulator returns one choice)")
	}
	text, prompt, e := promptOf(&req, chat)
	if a == apiResponses {
		text, prompt, e = nativePrompt(&req)
	}
	if e != nil {
		return nil, e
	}
	stops, e := stopsOf(req.Stop)
	if e != nil {
		return nil, e
	}
	j := &job{api: a, chat: chat, stream: req.Stream, prompt: prompt}
	j.cached = -1 // no prefix cache: usage has no prompt_tokens_details
	if s.prefix != nil {
		j.cached = 0
		j.blocks = blockHashes(text, 4*s.cfg.PrefixBlockTokens)
	}
	if a != apiCompletion {
		j.reasoning = s.cfg.ReasoningTokens
		if a == apiChat && len(req.Tools) > 0 {
			j.tool = req.Tools[0].Function.Name
			if j.tool == "" {
				j.tool = "tool"
			}
		}
	}
	j.includeUsage = req.Stream && req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	kind := "completion"
	if chat {
		kind = "chat"
	}
	if a >= apiResponses {
		j.includeUsage = false // these streams always end with usage
	}
	j.seed = textSeed(s.cfg.Seed, kind, text)
	if e := s.setLength(j, &req, stops); e != nil {
		return nil, e
	}
	return j, nil
}

// setLength decides how many tokens j delivers and why it ends.
func (s *Sim) setLength(j *job, req *genRequest, stops []string) *apiError {
	j.limit, j.finish = s.cfg.DefaultMaxTokens, "stop" // simulated end of sequence
	named := req.MaxCompletionTokens
	if named == nil {
		named = req.MaxOutputTokens
	}
	if named == nil {
		named = req.MaxTokens
	}
	if named != nil {
		if *named < 1 {
			return badRequest("invalid_value", "max_tokens must be at least 1, got %d", *named)
		}
		j.limit, j.finish = *named, "length"
	}
	if j.prompt+j.limit > s.cfg.KVCacheTokens {
		return badRequest("context_length_exceeded",
			"This model's maximum context length is %d tokens. However, you requested %d tokens "+
				"(%d in the prompt, %d in the completion).",
			s.cfg.KVCacheTokens, j.prompt+j.limit, j.prompt, j.limit)
	}
	if i := stopIndex(j.seed, j.limit, stops); i >= 0 {
		j.limit, j.finish = i, "stop"
	}
	return nil
}

// promptOf returns the prompt text and its estimated token count.
func promptOf(req *genRequest, chat bool) (string, int, *apiError) {
	if chat {
		if len(req.Messages) == 0 {
			return "", 0, badRequest("invalid_value", "messages must be a non-empty array")
		}
		var b strings.Builder
		chars := 0
		for i, m := range req.Messages {
			text, err := contentText(m.Content)
			if err != nil {
				return "", 0, badRequest("invalid_value", "messages[%d].content: %v", i, err)
			}
			chars += len(text)
			b.WriteString(m.Role)
			b.WriteByte(0)
			b.WriteString(text)
			b.WriteByte(0)
		}
		return b.String(), estimateTokens(chars), nil
	}
	return completionPrompt(req.Prompt)
}

// contentText returns a chat message content's text: a string, or the
// "text" of each part of an array (other parts count as nothing).
func contentText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return "", nil
	case raw[0] == '"':
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	case raw[0] == '[':
		var parts []struct {
			Text string `json:"text"`
		}
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", err
		}
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String(), nil
	}
	return "", errors.New("must be a string or an array of parts")
}

// completionPrompt reads a completion prompt: a string, an array of strings
// (joined: the simulator returns one choice), an array of token ids or an
// array of such arrays.
func completionPrompt(raw json.RawMessage) (string, int, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" || string(bytes.ReplaceAll(raw, []byte(" "), nil)) == "[]" {
		return "", 0, badRequest("invalid_value", "prompt is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, estimateTokens(len(s)), nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		t := strings.Join(ss, "\n")
		return t, estimateTokens(len(t)), nil
	}
	var ids []int
	if json.Unmarshal(raw, &ids) == nil {
		return tokenIDText(ids), max(1, len(ids)), nil
	}
	var idss [][]int
	if json.Unmarshal(raw, &idss) == nil {
		var b strings.Builder
		n := 0
		for _, ids := range idss {
			b.WriteString(tokenIDText(ids))
			b.WriteByte('\n')
			n += len(ids)
		}
		return b.String(), max(1, n), nil
	}
	return "", 0, badRequest("invalid_value",
		"prompt must be a string, an array of strings or an array of token ids")
}

func tokenIDText(ids []int) string {
	b := make([]byte, 0, 6*len(ids))
	for _, id := range ids {
		b = strconv.AppendInt(b, int64(id), 10)
		b = append(b, ' ')
	}
	return string(b)
}

// stopsOf reads "stop": a string or an array of strings.
func stopsOf(raw json.RawMessage) ([]string, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []string{s}, nil
	}
	var ss []string
	if err := json.Unmarshal(raw, &ss); err != nil {
		return nil, badRequest("invalid_value", "stop must be a string or an array of strings")
	}
	return ss, nil
}
