package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
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
	// N is the number of sequences the backend generates: the choices
	// asked for ("n"), or best_of when larger (legacy completions: vLLM
	// generates best_of sequences and returns the n best); 1 when both are
	// absent or null, else 1..maxChoices.
	N int64
	// modelAt and modelEnd are the span of the model member's string value
	// (with its quotes) in the body parseRequest returns; both 0 when the
	// body has no model string. The alias rewrite replaces it in place.
	modelAt, modelEnd int
	// promptAt and promptEnd are the span of the prompt member's value
	// (messages, prompt or input; Messages: messages) in the body
	// parseRequest returns, kept with the body's later edits; both 0 when
	// absent. prompt gives it to routing for prefix-cache affinity.
	promptAt, promptEnd int
}

// prompt is the raw JSON of the request's prompt in body (the body sent
// on), a sub-slice (no copy); nil when the request has none.
func (m *requestMeta) prompt(body []byte) []byte {
	if m.promptEnd <= m.promptAt || m.promptEnd > len(body) {
		return nil
	}
	return body[m.promptAt:m.promptEnd:m.promptEnd]
}

// maxChoices is the largest "n" accepted (vLLM and OpenAI take up to 128).
const maxChoices = 128

// parseOpenAI reads the fields the pipeline needs and, for a stream whose
// client did not ask for usage, returns a body that asks the backend for it.
// The body is read as the backends read it (vLLM and SGLang: Python's json
// and pydantic; TGI: serde): member names match exactly, and a body that
// spells one of the names the edge acts on twice, in any case or Unicode
// fold (openAIUnique), is refused, since one decoder may take the first and
// another the last. Any POST body of an OpenAI route is read so, whatever
// its Content-Type.
func parseOpenAI(body []byte) (requestMeta, []byte, error) {
	var f openAIFields
	if !f.scan(body) {
		if !json.Valid(body) {
			var v any
			err := json.Unmarshal(body, &v)
			msg := "request body is not valid JSON"
			if err != nil {
				msg += ": " + JSONProblem(err)
			}
			return requestMeta{}, nil, badRequest("invalid_json", msg)
		}
		if f.err != nil {
			return requestMeta{}, nil, f.err
		}
		return requestMeta{}, nil, badRequest("invalid_json", "request body is not a JSON object")
	}
	m := requestMeta{Model: f.model, Stream: f.stream, ClientUsage: f.options && f.includeUsage, N: 1,
		modelAt: f.modelAt, modelEnd: f.modelEnd}
	if f.hasN {
		m.N = f.n
	}
	if f.hasBestOf {
		m.N = max(m.N, f.bestOf)
	}
	switch {
	case f.hasMaxCompletion:
		m.OutputTokens = max(f.maxCompletion, 0)
	case f.hasMaxTokens:
		m.OutputTokens = max(f.maxTokens, 0)
	}
	m.InputTokens = int64(f.chars+f.prompt+f.input+3) / 4
	m.promptAt, m.promptEnd = f.promptAt, f.promptEnd
	if !m.Stream || m.ClientUsage {
		return m, body, nil
	}
	out := askForUsage(body, &f)
	if m.promptEnd > 0 && f.editAt <= m.promptAt { // nor inside the prompt's
		shift := len(out) - len(body)
		m.promptAt += shift
		m.promptEnd += shift
	}
	if m.modelEnd > 0 && f.editAt <= m.modelAt { // the edit is never inside the model's value
		shift := len(out) - len(body)
		m.modelAt += shift
		m.modelEnd += shift
	}
	return m, out, nil
}

// openAIFields is what parseOpenAI reads of a body.
type openAIFields struct {
	model  string
	stream bool
	// modelAt and modelEnd are the model string's span, 0 when absent.
	modelAt, modelEnd int
	// editAt is where askForUsage edited the body.
	editAt int
	// promptAt and promptEnd are the span of the prompt member's value
	// (messages, prompt or input; the last read), 0 when absent.
	promptAt, promptEnd int
	// options is set when stream_options is an object (null and absent
	// are alike); optStart and optEnd are its value's span (of null too),
	// 0 when absent.
	options          bool
	optStart, optEnd int
	includeUsage     bool
	// incStart and incEnd are the span of include_usage's value, 0 when
	// absent.
	incStart, incEnd int
	maxTokens        int64
	hasMaxTokens     bool
	// maxCompletion is max_completion_tokens.
	maxCompletion    int64
	hasMaxCompletion bool
	n                int64
	hasN             bool
	bestOf           int64
	hasBestOf        bool
	// chars is the length of the messages' raw contents plus 16 each
	// (role and framing cost a few tokens).
	chars int
	// prompt and input are the lengths of the raw values.
	prompt, input int
	// err is why a valid JSON body is refused (a repeated or mistyped
	// field).
	err *APIError
}

// The members parseOpenAI reads, in openAINames's order. The first
// openAIUnique are the ones the edge acts on: a body may not repeat them.
const (
	fieldModel = iota
	fieldStream
	fieldStreamOptions
	fieldMaxTokens
	fieldMaxCompletion
	fieldMaxOutput
	fieldN
	fieldBestOf
	openAIUnique

	fieldMessages = iota - 1
	fieldPrompt
	fieldInput
)

// openAINames is the table of the members parseOpenAI reads. To read a new
// member, add its name here (before openAIUnique when the edge acts on
// it) and a case to scan.
var openAINames = []string{"model", "stream", "stream_options", "max_tokens", "max_completion_tokens",
	"max_output_tokens", "n", "best_of", "messages", "prompt", "input"}

var (
	includeUsageName = []string{"include_usage"}
	contentName      = []string{"content"}
)

// guarded checks the member key that folds to name, one the edge acts on:
// it must be spelled exactly (a decoder that folds case, as Go's does,
// would take "MODEL" for "model", pydantic and serde would not) and come
// once (decoders keep the first, the last, or refuse). exact is key's
// index from fieldIndex, negative when not spelled exactly.
func guarded(key []byte, exact int, seen bool, name string) *APIError {
	switch {
	case seen:
		return badRequest("duplicate_field", "request body has the field "+strconv.Quote(name)+
			" more than once (in some spelling); send it once")
	case exact < 0:
		if len(key) > 64 {
			key = append(key[:64:64], `..."`...)
		}
		return badRequest("ambiguous_field", "request body has the field "+string(key)+
			"; spell it exactly "+strconv.Quote(name))
	}
	return nil
}

// wrongType is the error for a member whose value has the wrong type.
func wrongType(name, want string) *APIError {
	return badRequest("invalid_type", "field "+strconv.Quote(name)+" must be "+want)
}

// scan reads body in one pass, checking as it goes that it is valid JSON
// and an object. Names match exactly; a repeated name wins over earlier
// ones (as in Python's json), except the openAIUnique names, which may
// not repeat in any spelling. It reports false (with f.err when body is
// valid JSON) when the body is refused.
func (f *openAIFields) scan(body []byte) bool {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return false // invalid, or not an object
	}
	var model []byte // the model string, as written
	var seen uint32  // bit k: a name that folds to openAINames[k] was read
	end := scanObject(body, i, 1, func(key []byte, v int) int {
		exact, fold := fieldIndex(key, openAINames)
		if fold >= 0 && fold < openAIUnique {
			if f.err = guarded(key, exact, seen&(1<<fold) != 0, openAINames[fold]); f.err != nil {
				return -1
			}
			seen |= 1 << fold
		}
		switch exact {
		case fieldModel:
			switch body[v] {
			case '"':
				end := stringValid(body, v)
				if end > 0 {
					model = body[v:end]
					f.modelAt, f.modelEnd = v, end
				}
				return end
			case 'n':
				model, f.modelAt, f.modelEnd = nil, 0, 0
				return literalEnd(body, v, "null")
			}
			f.err = wrongType("model", "a string")
		case fieldStream:
			if end := boolValue(body, v, &f.stream); end >= 0 {
				return end
			}
			f.err = wrongType("stream", "true or false")
		case fieldStreamOptions:
			return f.scanOptions(body, v)
		case fieldMaxTokens:
			return f.intValue(body, v, "max_tokens", &f.maxTokens, &f.hasMaxTokens)
		case fieldMaxCompletion:
			return f.intValue(body, v, "max_completion_tokens", &f.maxCompletion, &f.hasMaxCompletion)
		case fieldN:
			return f.choices(body, v, "n", &f.n, &f.hasN)
		case fieldBestOf:
			return f.choices(body, v, "best_of", &f.bestOf, &f.hasBestOf)
		case fieldMessages:
			end := f.scanMessages(body, v)
			f.promptAt, f.promptEnd = v, end
			return end
		case fieldPrompt:
			end := skipValue(body, v, 1)
			f.prompt = end - v
			f.promptAt, f.promptEnd = v, end
			return end
		case fieldInput:
			end := skipValue(body, v, 1)
			f.input = end - v
			f.promptAt, f.promptEnd = v, end
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
	f.optStart = v
	switch body[v] {
	case 'n':
		f.optEnd = literalEnd(body, v, "null")
		return f.optEnd
	case '{':
		f.options = true
		seen := false
		f.optEnd = scanObject(body, v, 2, func(key []byte, v int) int {
			exact, fold := fieldIndex(key, includeUsageName)
			if fold < 0 {
				return skipValue(body, v, 2)
			}
			if f.err = guarded(key, exact, seen, "include_usage"); f.err != nil {
				return -1
			}
			seen = true
			end := boolValue(body, v, &f.includeUsage)
			if end < 0 {
				f.err = wrongType("stream_options.include_usage", "true or false")
			}
			f.incStart, f.incEnd = v, end
			return end
		})
		return f.optEnd
	}
	f.err = wrongType("stream_options", "an object")
	return -1
}

// scanMessages reads the messages value at body[v].
func (f *openAIFields) scanMessages(body []byte, v int) int {
	f.chars = 0
	switch body[v] {
	case 'n':
		return literalEnd(body, v, "null")
	case '[':
		return scanArray(body, v, 2, func(e int) int {
			f.chars += 16
			switch body[e] {
			case 'n':
				return literalEnd(body, e, "null")
			case '{':
				content := 0
				end := scanObject(body, e, 3, func(key []byte, v int) int {
					end := skipValue(body, v, 3)
					if exact, _ := fieldIndex(key, contentName); exact == 0 {
						content = end - v
					}
					return end
				})
				f.chars += content
				return end
			}
			f.err = wrongType("messages", "an array of objects")
			return -1
		})
	}
	f.err = wrongType("messages", "an array")
	return -1
}

// choices reads the sequence count at body[v] (n or best_of): null or an
// integer from 1 to maxChoices.
func (f *openAIFields) choices(body []byte, v int, name string, n *int64, set *bool) int {
	end := f.intValue(body, v, name, n, set)
	if end >= 0 && *set && (*n < 1 || *n > maxChoices) {
		f.err = badRequest("invalid_value", fmt.Sprintf("field %q must be an integer from 1 to %d", name, maxChoices))
		return -1
	}
	return end
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

// intValue reads an optional integer at body[v]: null clears it; a number
// must be an integer in int64's range (no fraction, no exponent).
func (f *openAIFields) intValue(body []byte, v int, name string, n *int64, set *bool) int {
	if body[v] == 'n' {
		*n, *set = 0, false
		return literalEnd(body, v, "null")
	}
	x, end := intNumber(body, v)
	if end >= 0 {
		*n, *set = x, true
	} else {
		f.err = wrongType(name, "an integer")
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

// askForUsage returns body with stream_options.include_usage set to true,
// editing the client's own members (scanned into f) so that the body never
// holds two of them, and keeping the client's bytes otherwise: the
// include_usage value is replaced, or the member added to the client's
// stream_options object, or the object replaces a null stream_options,
// or the member is added after the body's opening brace.
func askForUsage(body []byte, f *openAIFields) []byte {
	var at, to int
	var insert string
	switch {
	case f.incEnd > 0:
		at, to, insert = f.incStart, f.incEnd, "true"
	case f.options:
		at = f.optStart + 1
		to = at
		insert = `"include_usage":true,`
		if body[skipSpace(body, at)] == '}' {
			insert = `"include_usage":true`
		}
	case f.optEnd > 0:
		at, to, insert = f.optStart, f.optEnd, `{"include_usage":true}`
	default:
		at = bytes.IndexByte(body, '{') + 1
		to = at
		insert = `"stream_options":{"include_usage":true},`
		if body[skipSpace(body, at)] == '}' {
			insert = `"stream_options":{"include_usage":true}`
		}
	}
	f.editAt = at
	out := make([]byte, 0, len(body)-(to-at)+len(insert))
	out = append(out, body[:at]...)
	out = append(out, insert...)
	return append(out, body[to:]...)
}

// discard drains at most n bytes so the connection can be reused.
func discard(r io.Reader, n int64) { io.Copy(io.Discard, io.LimitReader(r, n)) }
