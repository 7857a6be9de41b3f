package proxy

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"
)

// This file is the one JSON scanner of the package: the request intake
// (parseOpenAI) and the relay's usage reading (usageOf) walk bodies with
// these functions, under encoding/json's rules for structure (what is
// valid, how deep it may nest). Each
// function takes the data and an index and returns the index after what it
// read, or -1 when the data is not valid JSON there. Member names match
// exactly, as the backends match them (fieldIndex).

// fieldIndex matches the member name key (quoted, as written) with names.
// exact is the index of the name key is once unescaped, byte for byte, as
// the backends' decoders match (Python's json and pydantic, Rust's serde),
// or -1. fold is the index of the name key equals under Unicode case
// folding (so "\u212a", the Kelvin sign, is a k), as encoding/json would
// match it, or -1: the scans refuse a body that spells one name twice, in
// any of these ways, since a decoder somewhere may take either.
func fieldIndex(key []byte, names []string) (exact, fold int) {
	k := key[1 : len(key)-1]
	for _, c := range k {
		if c == '\\' || c >= utf8.RuneSelf {
			u := unquote(key)
			for i, n := range names {
				if strings.EqualFold(u, n) {
					if u == n {
						return i, i
					}
					return -1, i
				}
			}
			return -1, -1
		}
	}
	for i, n := range names {
		if len(k) != len(n) {
			continue
		}
		if string(k) == n { // the usual case first: names are lower-case
			return i, i
		}
		if equalLower(k, n) {
			return -1, i
		}
	}
	return -1, -1
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

// skipSpace returns the index of the first byte at or after data[i] that
// is not JSON white space (len(data) when there is none).
func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
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

// intNumber reads the integer at data[i] as encoding/json reads a number
// into an int64 (strconv.ParseInt: no fraction, no exponent, in range). It
// returns the integer and the index after it, or -1 when data[i] is not a
// number or the number is not such an integer.
func intNumber(data []byte, i int) (int64, int) {
	end := numberEnd(data, i)
	if end < 0 {
		return 0, -1
	}
	x, err := strconv.ParseInt(string(data[i:end]), 10, 64)
	if err != nil {
		return 0, -1
	}
	return x, end
}

// literalEnd returns the index after lit (true, false or null) at data[i],
// or -1.
func literalEnd(data []byte, i int, lit string) int {
	if len(data)-i < len(lit) || string(data[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
}
