package routing

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// Errors of the exposition parser.
var (
	errBadName   = errors.New("bad metric name")
	errBadLabels = errors.New("bad label set")
	errBadValue  = errors.New("bad sample value")
	errTrailing  = errors.New("unexpected text after the sample")
	errBadType   = errors.New("bad TYPE comment")
)

// scanExposition reads a Prometheus text exposition (format 0.0.4, and the
// OpenMetrics text that engines emit: "# EOF", exemplars) and calls fn with
// the metric name and value of every sample, in order. It is strict: a
// line that is neither blank, a comment nor a well-formed sample stops the
// scan with an error naming the line. The name passed to fn aliases data.
// It allocates nothing.
//
// A sample is a name (or, in the UTF-8 form, a quoted name first inside
// the braces), an optional label set of name="value" pairs (values escape
// only \\, \" and \n), a float value (NaN, +Inf and -Inf included), an
// optional integer timestamp and an optional exemplar after " # ".
func scanExposition(data []byte, fn func(name []byte, v float64)) error {
	for n := 1; len(data) > 0; n++ {
		var line []byte
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			line, data = data, nil
		}
		line = bytes.TrimRight(bytes.TrimLeft(line, " \t"), " \t\r")
		if len(line) == 0 {
			continue
		}
		if line[0] == '#' {
			if string(line) == "# EOF" {
				return nil
			}
			if err := checkComment(line); err != nil {
				return fmt.Errorf("line %d: %w", n, err)
			}
			continue
		}
		name, v, err := parseSample(line)
		if err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
		fn(name, v)
	}
	return nil
}

// checkComment checks "# HELP name …" and "# TYPE name type"; other
// comments are free text.
func checkComment(line []byte) error {
	rest, ok := bytes.CutPrefix(line, []byte("# "))
	if !ok {
		return nil
	}
	var kw []byte
	kw, rest = field(rest)
	isType := string(kw) == "TYPE"
	if !isType && string(kw) != "HELP" {
		return nil
	}
	var name []byte
	if len(rest) > 0 && rest[0] == '"' {
		var err error
		var next int
		if name, next, err = quoted(rest, 0); err != nil {
			return fmt.Errorf("%w in %s comment: %w", errBadName, kw, err)
		}
		rest = bytes.TrimLeft(rest[next:], " \t")
	} else if name, rest = field(rest); !validName(name) {
		return fmt.Errorf("%w %q in %s comment", errBadName, clip(name), kw)
	}
	if !isType || len(rest) == 0 {
		return nil
	}
	for _, t := range metricTypes {
		if bytes.EqualFold(rest, []byte(t)) {
			return nil
		}
	}
	return fmt.Errorf("%w: type %q", errBadType, clip(rest))
}

// metricTypes are the types a TYPE comment may name (any case).
var metricTypes = []string{"counter", "gauge", "histogram", "summary", "untyped",
	"gauge_histogram", "gaugehistogram", "unknown", "info", "stateset"}

// field splits off the first space-separated word.
func field(b []byte) (word, rest []byte) {
	b = bytes.TrimLeft(b, " \t")
	i := bytes.IndexAny(b, " \t")
	if i < 0 {
		return b, nil
	}
	return b[:i], bytes.TrimLeft(b[i:], " \t")
}

// parseSample parses one sample line (trimmed, not blank, not a comment).
func parseSample(line []byte) (name []byte, v float64, err error) {
	i := 0
	if line[0] != '{' {
		for i < len(line) && nameChar(line[i], i == 0) {
			i++
		}
		if i == 0 {
			return nil, 0, fmt.Errorf("%w at %q", errBadName, clip(line))
		}
		name = line[:i]
		if i < len(line) && line[i] != ' ' && line[i] != '\t' && line[i] != '{' {
			return nil, 0, fmt.Errorf("%w %q", errBadName, clip(line[:i+1]))
		}
		i = skipSpace(line, i)
	}
	if i < len(line) && line[i] == '{' {
		var quoted []byte
		if quoted, i, err = parseLabels(line, i, name == nil); err != nil {
			return nil, 0, err
		}
		if name == nil {
			name = quoted
		}
		i = skipSpace(line, i)
	}
	if len(name) == 0 {
		return nil, 0, fmt.Errorf("%w: no name in %q", errBadName, clip(line))
	}
	if i >= len(line) {
		return nil, 0, fmt.Errorf("%w: no value after %q", errBadValue, clip(line))
	}
	val, rest := field(line[i:])
	if bytes.ContainsAny(val, "xXpP_") { // no hex floats or digit separators
		return nil, 0, fmt.Errorf("%w %q", errBadValue, clip(val))
	}
	v, perr := strconv.ParseFloat(string(val), 64)
	if perr != nil {
		return nil, 0, fmt.Errorf("%w %q", errBadValue, clip(val))
	}
	if len(rest) > 0 && rest[0] != '#' {
		var ts []byte
		ts, rest = field(rest)
		if _, perr := strconv.ParseInt(string(ts), 10, 64); perr != nil {
			if _, ferr := strconv.ParseFloat(string(ts), 64); ferr != nil || bytes.ContainsAny(ts, "xXpP_") {
				return nil, 0, fmt.Errorf("%w: bad timestamp %q", errTrailing, clip(ts)) // OpenMetrics timestamps are seconds
			}
		}
	}
	if len(rest) > 0 && (rest[0] != '#' || len(rest) < 2 || rest[1] != ' ') {
		return nil, 0, fmt.Errorf("%w: %q", errTrailing, clip(rest))
	}
	return name, v, nil
}

// parseLabels parses the label set starting at line[i] == '{' and returns
// the index after the closing brace. When nameFirst is set, the set may
// start with a quoted metric name (the UTF-8 form), which it returns.
func parseLabels(line []byte, i int, nameFirst bool) (name []byte, next int, err error) {
	i++ // '{'
	for first := true; ; first = false {
		i = skipSpace(line, i)
		if i >= len(line) {
			return nil, 0, fmt.Errorf("%w: unterminated", errBadLabels)
		}
		if line[i] == '}' {
			return name, i + 1, nil
		}
		var label []byte
		wasQuoted := line[i] == '"'
		if wasQuoted {
			label, i, err = quoted(line, i)
			if err != nil {
				return nil, 0, err
			}
		} else {
			j := i
			for i < len(line) && nameChar(line[i], i == j) && line[i] != ':' {
				i++
			}
			if i == j {
				return nil, 0, fmt.Errorf("%w: bad label name at %q", errBadLabels, clip(line[j:]))
			}
			label = line[j:i]
		}
		i = skipSpace(line, i)
		switch {
		case i < len(line) && line[i] == '=':
			i = skipSpace(line, i+1)
			if i >= len(line) || line[i] != '"' {
				return nil, 0, fmt.Errorf("%w: label %q has no quoted value", errBadLabels, label)
			}
			if _, i, err = quoted(line, i); err != nil {
				return nil, 0, err
			}
		case first && nameFirst && wasQuoted:
			name = label
		default:
			return nil, 0, fmt.Errorf("%w: label %q has no value", errBadLabels, label)
		}
		i = skipSpace(line, i)
		if i < len(line) && line[i] == ',' {
			i++
		} else if i >= len(line) || line[i] != '}' {
			return nil, 0, fmt.Errorf("%w: want , or } at %q", errBadLabels, clip(line[min(i, len(line)):]))
		}
	}
}

// quoted parses a double-quoted string at line[i] and returns its raw
// content (escapes left in) and the index after the closing quote.
func quoted(line []byte, i int) (s []byte, next int, err error) {
	j := i + 1
	for k := j; k < len(line); k++ {
		switch line[k] {
		case '\\':
			if k+1 >= len(line) {
				return nil, 0, fmt.Errorf("%w: unterminated escape", errBadLabels)
			}
			switch line[k+1] {
			case '\\', '"', 'n':
				k++
			default:
				return nil, 0, fmt.Errorf("%w: bad escape \\%c", errBadLabels, line[k+1])
			}
		case '"':
			return line[j:k], k + 1, nil
		}
	}
	return nil, 0, fmt.Errorf("%w: unterminated string", errBadLabels)
}

func skipSpace(line []byte, i int) int {
	for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
		i++
	}
	return i
}

// nameChar reports whether c may appear in a metric name ([a-zA-Z_:]
// first, then also digits).
func nameChar(c byte, first bool) bool {
	return c == '_' || c == ':' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || (!first && '0' <= c && c <= '9')
}

func validName(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for i, c := range b {
		if !nameChar(c, i == 0) {
			return false
		}
	}
	return true
}

// clip shortens text quoted in an error.
func clip(b []byte) []byte {
	if len(b) > 40 {
		return b[:40]
	}
	return b
}
