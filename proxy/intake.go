package proxy

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"unicode/utf8"
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
// The body is scanned once, without decoding it; what the scan leaves (an
// invalid body, a field of the wrong type, a repeated messages array) is
// decoded by encoding/json, whose result the scan matches (FuzzParseOpenAI)
// and whose errors name the problem.
func parseOpenAI(body []byte) (requestMeta, []byte, error) {
	var f openAIFields
	if !f.scan(body) {
		if err := f.decode(body); err != nil {
			return requestMeta{}, nil, badRequest("invalid_json", "request body is not valid JSON: "+jsonProblem(err))
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
	end := numberEnd(body, v)
	if end < 0 {
		return -1
	}
	x, err := strconv.ParseInt(string(body[v:end]), 10, 64)
	if err != nil {
		return -1
	}
	*n, *set = x, true
	return end
}

// fieldIndex returns the index in names of the member name key (quoted, as
// written), or -1. Names match as encoding/json matches struct fields:
// unescaped, then compared under Unicode case folding (so "\u212a", the
// Kelvin sign, is a k).
func fieldIndex(key []byte, names []string) int {
	k := key[1 : len(key)-1]
	for _, c := range k {
		if c == '\\' || c >= utf8.RuneSelf {
			k = []byte(unquote(key))
			for i, n := range names {
				if bytes.EqualFold(k, []byte(n)) {
					return i
				}
			}
			return -1
		}
	}
	for i, n := range names {
		if len(k) == len(n) && equalLower(k, n) {
			return i
		}
	}
	return -1
}

// equalLower reports whether ASCII k equals the lower-case name n when
// k's letters are lowered.
func equalLower(k []byte, n string) bool {
	for i, c := range k {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != n[i] {
			return false
		}
	}
	return true
}

// unquote returns the valid JSON string s unescaped. encoding/json does
// the rare escaped or not UTF-8 one (invalid bytes become U+FFFD).
func unquote(s []byte) string {
	in := s[1 : len(s)-1]
	if bytes.IndexByte(in, '\\') < 0 && utf8.Valid(in) {
		return string(in)
	}
	var out string
	json.Unmarshal(s, &out)
	return out
}

// maxJSONDepth is encoding/json's limit on nesting: deeper is invalid.
const maxJSONDepth = 10000

// scanObject checks the object at data[i] (its '{', at nesting depth) and
// calls member with each member's name (quoted, as written) and the index
// of its value. member checks the value and returns the index after it, or
// -1. scanObject returns the index after the object, or -1.
func scanObject(data []byte, i, depth int, member func(key []byte, v int) int) int {
	if depth > maxJSONDepth {
		return -1
	}
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return i + 1
	}
	for {
		kend, v := memberValue(data, i)
		if v < 0 || v >= len(data) {
			return -1
		}
		if i = member(data[i:kend], v); i < 0 {
			return -1
		}
		next, done := afterItem(data, i, '}')
		if done || next < 0 {
			return next
		}
		i = next
	}
}

// afterItem reads what follows a member or an element at data[i]: a comma
// (next is the index of the next item) or closer (done, next is the index
// after it); next is -1 for anything else.
func afterItem(data []byte, i int, closer byte) (next int, done bool) {
	if i = skipSpace(data, i); i >= len(data) {
		return -1, false
	}
	switch data[i] {
	case ',':
		return skipSpace(data, i+1), false
	case closer:
		return i + 1, true
	}
	return -1, false
}

// scanArray is scanObject for the array at data[i]: elem gets the index of
// each element.
func scanArray(data []byte, i, depth int, elem func(v int) int) int {
	if depth > maxJSONDepth {
		return -1
	}
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == ']' {
		return i + 1
	}
	for {
		if i >= len(data) {
			return -1
		}
		if i = elem(i); i < 0 {
			return -1
		}
		next, done := afterItem(data, i, ']')
		if done || next < 0 {
			return next
		}
		i = next
	}
}

// skipValue checks the value at data[i] (i < len(data)), inside depth
// containers, and returns the index after it, or -1. It loops rather than
// recurses: a body nested 10000 deep must not grow the stack.
func skipValue(data []byte, i, depth int) int {
	var objects uint64 // bit k: the kth open container is an object
	var deeper []bool  // the same beyond 64 open containers
	open := 0
	for {
		switch c := data[i]; c {
		case '{', '[':
			if depth+open+1 > maxJSONDepth {
				return -1
			}
			if open < 64 {
				objects = objects&^(1<<open) | b2u(c == '{')<<open
			} else {
				deeper = append(deeper[:open-64], c == '{')
			}
			open++
			if i = skipSpace(data, i+1); i < len(data) && data[i] == c+2 { // '}' or ']'
				i++
				open--
				break
			}
			if c == '{' {
				_, i = memberValue(data, i)
			}
			if i < 0 || i >= len(data) {
				return -1
			}
			continue
		case '"':
			i = stringValid(data, i)
		case 't':
			i = literalEnd(data, i, "true")
		case 'f':
			i = literalEnd(data, i, "false")
		case 'n':
			i = literalEnd(data, i, "null")
		default:
			i = numberEnd(data, i)
		}
		// After a value: the next one, or the ends of containers.
		for {
			if i < 0 {
				return -1
			}
			if open == 0 {
				return i
			}
			if i = skipSpace(data, i); i >= len(data) {
				return -1
			}
			obj := open > 64 && deeper[open-65] || open <= 64 && objects&(1<<(open-1)) != 0
			if data[i] == ',' {
				if i = skipSpace(data, i+1); obj {
					_, i = memberValue(data, i)
				}
				if i < 0 || i >= len(data) {
					return -1
				}
				break
			}
			if obj && data[i] != '}' || !obj && data[i] != ']' {
				return -1
			}
			i++
			open--
		}
	}
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// memberValue reads a member's name and colon at data[i]: it returns the
// index after the name and the index of the value (maybe len(data)), or
// -1s.
func memberValue(data []byte, i int) (nameEnd, v int) {
	if i >= len(data) || data[i] != '"' {
		return -1, -1
	}
	if nameEnd = stringValid(data, i); nameEnd < 0 {
		return -1, -1
	}
	if v = skipSpace(data, nameEnd); v >= len(data) || data[v] != ':' {
		return -1, -1
	}
	return nameEnd, skipSpace(data, v+1)
}

// stringValid returns the index after the JSON string at data[i] (a
// quote), or -1 when it is cut or has a control character or a bad escape.
func stringValid(data []byte, i int) int {
	j := i + 1
	for {
		// Contents are most of a body: 8 plain bytes at a time.
		for j+8 <= len(data) && !hasStringStop(binary.LittleEndian.Uint64(data[j:])) {
			j += 8
		}
		for j < len(data) && !stringStop[data[j]] {
			j++
		}
		if j >= len(data) {
			return -1
		}
		switch data[j] {
		case '"':
			return j + 1
		case '\\':
			if j+1 >= len(data) {
				return -1
			}
			switch data[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j += 2
			case 'u':
				if j+6 > len(data) || !isHex(data[j+2]) || !isHex(data[j+3]) || !isHex(data[j+4]) || !isHex(data[j+5]) {
					return -1
				}
				j += 6
			default:
				return -1
			}
		default:
			return -1 // a control character
		}
	}
}

// stringStop marks the bytes that end a run of plain string contents: a
// quote, a backslash and the control characters.
var stringStop = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// hasStringStop reports whether one of the 8 bytes of x is a stringStop
// (the zero-byte test of Hacker's Delight, exact for whether there is one).
func hasStringStop(x uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	q := x ^ (ones * '"')
	b := x ^ (ones * '\\')
	return ((q-ones)&^q|(b-ones)&^b|(x-ones*0x20)&^x)&highs != 0
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// numberEnd returns the index after the JSON number at data[i], or -1.
func numberEnd(data []byte, i int) int {
	if i < len(data) && data[i] == '-' {
		i++
	}
	switch {
	case i >= len(data):
		return -1
	case data[i] == '0':
		i++
	case '1' <= data[i] && data[i] <= '9':
		i = digitsEnd(data, i+1)
	default:
		return -1
	}
	if i < len(data) && data[i] == '.' {
		if j := digitsEnd(data, i+1); j > i+1 {
			i = j
		} else {
			return -1
		}
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		j := digitsEnd(data, i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}

func digitsEnd(data []byte, i int) int {
	for i < len(data) && '0' <= data[i] && data[i] <= '9' {
		i++
	}
	return i
}

// literalEnd returns the index after lit (true, false or null) at data[i],
// or -1.
func literalEnd(data []byte, i int, lit string) int {
	if len(data)-i < len(lit) || string(data[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
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
