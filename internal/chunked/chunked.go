// Package chunked encodes and decodes HTTP/1.1's chunked transfer coding
// (RFC 9112 §7.1) incrementally, for code that owns its sockets: the
// HTTP/1.1 upstream client and the event loop that relays committed
// streams. Unlike net/http's reader it can be fed any split of the input,
// one read at a time, and it decodes in place.
package chunked

import (
	"errors"
	"net/http"
	"sort"
	"strconv"
)

// ErrMalformed reports input that is not chunked coding.
var ErrMalformed = errors.New("chunked: malformed chunked encoding")

// ErrLineTooLong reports a chunk-size or trailer line longer than MaxLine.
var ErrLineTooLong = errors.New("chunked: header line too long")

// MaxLine bounds a chunk-size line (with extensions) and a trailer line,
// as net/http does.
const MaxLine = 4096

type state uint8

const (
	stSize        state = iota // hex digits of a chunk size
	stExt                      // chunk extension, up to the line end
	stSizeLF                   // the LF after a size line's CR
	stData                     // n payload bytes left
	stDataCR                   // the CR after a chunk's data
	stDataLF                   // the LF after it
	stTrailer                  // start of a trailer line (or the final CRLF)
	stTrailerLine              // inside a trailer line
	stTrailerLF                // the LF ending a trailer line
	stEndLF                    // the LF of the final empty line
	stDone
)

// Decoder is the state of one chunked body being decoded. The zero value
// is ready for a new body.
type Decoder struct {
	st     state
	digits int    // hex digits read in the current size
	n      uint64 // chunk size being read, then payload bytes left
	line   int    // bytes of the current size or trailer line
	last   bool   // the current size line is the last chunk's (0)
}

// Done reports that the last chunk and the trailer section were read.
func (d *Decoder) Done() bool { return d.st == stDone }

// Decode decodes src, appending the payload to dst, and returns the
// extended dst, how many bytes of src it consumed and whether the body
// ended. It consumes all of src unless the body ends inside it: the bytes
// after the end (n < len(src)) belong to whatever follows on the
// connection. dst may be src[:0]: the payload never runs ahead of the
// input, so the body is decoded in place. Trailers are read and dropped.
func (d *Decoder) Decode(dst, src []byte) (out []byte, n int, done bool, err error) {
	i := 0
	for i < len(src) {
		c := src[i]
		switch d.st {
		case stData:
			k := len(src) - i
			if uint64(k) > d.n {
				k = int(d.n)
			}
			dst = append(dst, src[i:i+k]...)
			d.n -= uint64(k)
			i += k
			if d.n == 0 {
				d.st = stDataCR
			}
			continue
		case stSize:
			if v, ok := unhex(c); ok {
				if d.digits == 16 {
					return dst, i, false, ErrMalformed
				}
				d.n = d.n<<4 | uint64(v)
				d.digits++
				break
			}
			if d.digits == 0 {
				return dst, i, false, ErrMalformed
			}
			switch c {
			case ';', ' ', '\t':
				d.st = stExt
			case '\r':
				d.st = stSizeLF
			case '\n':
				d.sizeDone()
			default:
				return dst, i, false, ErrMalformed
			}
		case stExt:
			switch c {
			case '\r':
				d.st = stSizeLF
			case '\n':
				d.sizeDone()
			}
		case stSizeLF:
			if c != '\n' {
				return dst, i, false, ErrMalformed
			}
			d.sizeDone()
		case stDataCR:
			if c != '\r' {
				return dst, i, false, ErrMalformed
			}
			d.st = stDataLF
		case stDataLF:
			if c != '\n' {
				return dst, i, false, ErrMalformed
			}
			d.st, d.n, d.digits, d.line = stSize, 0, 0, 0
		case stTrailer:
			switch c {
			case '\r':
				d.st = stEndLF
			case '\n':
				d.st = stDone
				return dst, i + 1, true, nil
			default:
				d.st, d.line = stTrailerLine, 0
			}
		case stTrailerLine:
			switch c {
			case '\r':
				d.st = stTrailerLF
			case '\n':
				d.st = stTrailer
			}
		case stTrailerLF:
			if c != '\n' {
				return dst, i, false, ErrMalformed
			}
			d.st = stTrailer
		case stEndLF:
			if c != '\n' {
				return dst, i, false, ErrMalformed
			}
			d.st = stDone
			return dst, i + 1, true, nil
		case stDone:
			return dst, i, true, nil
		}
		i++
		if d.line++; d.line > MaxLine {
			return dst, i, false, ErrLineTooLong
		}
	}
	return dst, i, d.st == stDone, nil
}

// sizeDone ends a chunk-size line: data follows, or the trailer section
// after the last chunk.
func (d *Decoder) sizeDone() {
	d.line = 0
	if d.n == 0 {
		d.st = stTrailer
		return
	}
	d.st = stData
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// AppendChunk appends p to dst as one chunk; nothing when p is empty (an
// empty chunk would end the body).
func AppendChunk(dst, p []byte) []byte {
	if len(p) == 0 {
		return dst
	}
	dst = strconv.AppendUint(dst, uint64(len(p)), 16)
	dst = append(dst, '\r', '\n')
	dst = append(dst, p...)
	return append(dst, '\r', '\n')
}

// AppendLast appends the last chunk, the trailer fields (sorted by name,
// each value on its own line) and the final CRLF: the end of the body.
func AppendLast(dst []byte, trailer http.Header) []byte {
	dst = append(dst, '0', '\r', '\n')
	if len(trailer) > 0 {
		keys := make([]string, 0, len(trailer))
		for k := range trailer {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			for _, v := range trailer[k] {
				dst = append(dst, k...)
				dst = append(dst, ':', ' ')
				dst = append(dst, v...)
				dst = append(dst, '\r', '\n')
			}
		}
	}
	return append(dst, '\r', '\n')
}
