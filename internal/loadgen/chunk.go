package loadgen

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// chunk is what the generator reads from a chat.completion.chunk, a
// completion chunk or a non-streamed completion: how many choices carry
// content, the usage, and an error object. parse walks the JSON bytes
// without building values, so an event costs no allocation.
type chunk struct {
	// tokens is the number of choices with content in the last parse.
	tokens int
	// hasUsage and completionTokens come from a non-null "usage" object.
	hasUsage         bool
	completionTokens int
	// errRaw is the raw value of a top-level "error" key (nil if absent
	// or null); it aliases the parsed data.
	errRaw []byte
	// emitNs is the top-level EmitField (the simulator's emit time in Unix
	// nanoseconds) when hasEmit; a value that is not a non-negative
	// integer that fits in int64 is ignored.
	emitNs  int64
	hasEmit bool
}

// EmitField is the top-level chunk field in which a backend (the Sluice
// simulator with stamp_tokens) reports when it wrote the chunk, in Unix
// nanoseconds; the generator turns it into the token delay.
const EmitField = "sluice_emit_ns"

// maxJSONDepth bounds nesting so hostile input cannot exhaust the stack.
const maxJSONDepth = 64

var errBadJSON = errors.New("invalid json")

// parse reads data and returns the number of choices that carry content:
// a non-empty delta or message content, reasoning_content, reasoning or
// tool_calls, or a non-empty text (empty means null, "", [] or {}).
func (c *chunk) parse(data []byte) (int, error) {
	*c = chunk{}
	w := jsonWalker{b: data}
	w.ws()
	err := w.object(0, func(key []byte) error {
		switch string(key) {
		case "choices":
			return w.array(1, func() error { return c.choice(&w) })
		case "usage":
			return c.usage(&w)
		case EmitField:
			start := w.i
			if err := w.skip(1); err != nil {
				return err
			}
			c.emitNs, c.hasEmit = parseEmitNs(data[start:w.i])
			return nil
		case "error":
			start := w.i
			if err := w.skip(1); err != nil {
				return err
			}
			if v := data[start:w.i]; !isEmptyJSON(v) {
				c.errRaw = v
			}
			return nil
		}
		return w.skip(1)
	})
	if err == nil && w.ws() < len(data) {
		err = fmt.Errorf("%w: trailing data at %d", errBadJSON, w.i)
	}
	if err != nil {
		*c = chunk{}
		return 0, err
	}
	return c.tokens, nil
}

func (c *chunk) choice(w *jsonWalker) error {
	if w.peek() == 'n' {
		return w.skip(2)
	}
	has := false
	err := w.object(2, func(key []byte) error {
		switch string(key) {
		case "delta", "message":
			if w.peek() != '{' {
				return w.skip(3)
			}
			return w.object(3, func(k []byte) error {
				switch string(k) {
				case "content", "reasoning_content", "reasoning", "tool_calls":
					ne, err := w.nonEmpty(4)
					has = has || ne
					return err
				}
				return w.skip(4)
			})
		case "text":
			ne, err := w.nonEmpty(3)
			has = has || ne
			return err
		}
		return w.skip(3)
	})
	if has {
		c.tokens++
	}
	return err
}

func (c *chunk) usage(w *jsonWalker) error {
	if w.peek() != '{' {
		return w.skip(1)
	}
	c.hasUsage = true
	return w.object(1, func(key []byte) error {
		if string(key) != "completion_tokens" {
			return w.skip(2)
		}
		start := w.i
		if err := w.skip(2); err != nil {
			return err
		}
		n, err := strconv.Atoi(string(w.b[start:w.i])) // no allocation: converted for the call only
		if err == nil {
			c.completionTokens = n
		}
		return nil
	})
}

// parseEmitNs reads v, a JSON value, as a non-negative int64 written in
// plain digits; ok is false for anything else (a string, a fraction, an
// exponent, a sign, an overflow).
func parseEmitNs(v []byte) (ns int64, ok bool) {
	if len(v) == 0 || len(v) > 19 {
		return 0, false
	}
	var n uint64
	for _, b := range v {
		if b < '0' || b > '9' {
			return 0, false
		}
		n = n*10 + uint64(b-'0')
	}
	if n > 1<<63-1 {
		return 0, false
	}
	return int64(n), true
}

// hasError reports whether the chunk carried a non-null error value.
func (c *chunk) hasError() bool { return c.errRaw != nil }

// isEmptyJSON reports whether v is null, "", [] or {} (spaces allowed).
func isEmptyJSON(v []byte) bool {
	w := jsonWalker{b: v}
	w.ws()
	switch w.peek() {
	case 'n':
		return true
	case '"':
		return w.i+1 < len(v) && v[w.i+1] == '"'
	case '[', '{':
		close := byte(']')
		if v[w.i] == '{' {
			close = '}'
		}
		w.i++
		w.ws()
		return w.peek() == close
	}
	return len(v) == 0
}

// jsonWalker steps through JSON text; it validates structure, strings and
// literals as it goes but builds nothing.
type jsonWalker struct {
	b []byte
	i int
}

// ws skips white space and returns the new position.
func (w *jsonWalker) ws() int {
	for w.i < len(w.b) {
		switch w.b[w.i] {
		case ' ', '\t', '\n', '\r':
			w.i++
		default:
			return w.i
		}
	}
	return w.i
}

func (w *jsonWalker) peek() byte {
	if w.i < len(w.b) {
		return w.b[w.i]
	}
	return 0
}

func (w *jsonWalker) fail(what string) error {
	return fmt.Errorf("%w: %s at offset %d", errBadJSON, what, w.i)
}

// object walks {"key": value, …}, calling field with w positioned at each
// value; field must consume the value.
func (w *jsonWalker) object(depth int, field func(key []byte) error) error {
	if depth > maxJSONDepth {
		return w.fail("nesting too deep")
	}
	if w.peek() != '{' {
		return w.fail("object expected")
	}
	w.i++
	w.ws()
	if w.peek() == '}' {
		w.i++
		return nil
	}
	for {
		key, err := w.str()
		if err != nil {
			return err
		}
		w.ws()
		if w.peek() != ':' {
			return w.fail("colon expected")
		}
		w.i++
		w.ws()
		if err := field(key); err != nil {
			return err
		}
		if done, err := w.next('}'); done || err != nil {
			return err
		}
	}
}

// array walks [value, …], calling elem with w positioned at each element.
func (w *jsonWalker) array(depth int, elem func() error) error {
	if depth > maxJSONDepth {
		return w.fail("nesting too deep")
	}
	if w.peek() != '[' {
		if w.peek() == 'n' { // "choices": null
			return w.skip(depth)
		}
		return w.fail("array expected")
	}
	w.i++
	w.ws()
	if w.peek() == ']' {
		w.i++
		return nil
	}
	for {
		if err := elem(); err != nil {
			return err
		}
		if done, err := w.next(']'); done || err != nil {
			return err
		}
	}
}

// next consumes a comma (more follows) or the closing byte (done).
func (w *jsonWalker) next(closing byte) (bool, error) {
	w.ws()
	switch w.peek() {
	case ',':
		w.i++
		w.ws()
		return false, nil
	case closing:
		w.i++
		return true, nil
	}
	return false, w.fail("comma or " + string(closing) + " expected")
}

// str consumes a string and returns its raw content (escapes kept).
func (w *jsonWalker) str() ([]byte, error) {
	if w.peek() != '"' {
		return nil, w.fail("string expected")
	}
	start := w.i + 1
	for i := start; i < len(w.b); i++ {
		switch c := w.b[i]; {
		case c == '\\':
			i++
		case c == '"':
			w.i = i + 1
			return w.b[start:i], nil
		case c < 0x20:
			w.i = i
			return nil, w.fail("control character in string")
		}
	}
	w.i = len(w.b)
	return nil, w.fail("unterminated string")
}

// nonEmpty consumes a value and reports whether it is not null, "", [] or {}.
func (w *jsonWalker) nonEmpty(depth int) (bool, error) {
	start := w.i
	if err := w.skip(depth); err != nil {
		return false, err
	}
	return !isEmptyJSON(w.b[start:w.i]), nil
}

// skip consumes any value.
func (w *jsonWalker) skip(depth int) error {
	switch c := w.peek(); {
	case c == '{':
		return w.object(depth+1, func([]byte) error { return w.skip(depth + 1) })
	case c == '[':
		return w.array(depth+1, func() error { return w.skip(depth + 1) })
	case c == '"':
		_, err := w.str()
		return err
	case c == '-' || (c >= '0' && c <= '9'):
		return w.number()
	}
	for _, lit := range []string{"true", "false", "null"} {
		if len(w.b)-w.i >= len(lit) && string(w.b[w.i:w.i+len(lit)]) == lit {
			w.i += len(lit)
			return nil
		}
	}
	return w.fail("value expected")
}

// number consumes -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (w *jsonWalker) number() error {
	if w.peek() == '-' {
		w.i++
	}
	switch c := w.peek(); {
	case c == '0':
		w.i++
	case c >= '1' && c <= '9':
		w.digits()
	default:
		return w.fail("bad number")
	}
	if w.peek() == '.' {
		w.i++
		if w.digits() == 0 {
			return w.fail("bad number")
		}
	}
	if c := w.peek(); c == 'e' || c == 'E' {
		w.i++
		if c := w.peek(); c == '+' || c == '-' {
			w.i++
		}
		if w.digits() == 0 {
			return w.fail("bad number")
		}
	}
	return nil
}

func (w *jsonWalker) digits() int {
	n := 0
	for w.i < len(w.b) && w.b[w.i] >= '0' && w.b[w.i] <= '9' {
		w.i++
		n++
	}
	return n
}

// errorMessage extracts error.message (or the raw error) for a report.
func errorMessage(raw []byte) string {
	var e struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &e) == nil && e.Message != "" {
		return e.Message
	}
	var s string
	if json.Unmarshal(raw, &s) == nil && s != "" {
		return s
	}
	return truncate(string(raw), 200)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
