package loadgen

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// sseKind is what sseReader.next found.
type sseKind int

const (
	// sseEvent: an event was dispatched; see sseReader.data and .event.
	sseEvent sseKind = iota + 1
	// sseTiming: a ": server-timing …" comment; see sseReader.comment.
	sseTiming
)

// errEventTooLarge is returned for an event or line over the size limit.
var errEventTooLarge = errors.New("sse event too large")

// maxEventSize bounds one SSE event (and one line) in bytes.
const maxEventSize = 4 << 20

// sseReader reads Server-Sent Events one at a time, as they arrive, with no
// allocation per event in the steady state. Lines end in LF or CRLF (a lone
// CR is not a line end). It dispatches on a blank line an event that had a
// data or event field; bytes after the last blank line at EOF are an
// incomplete event and are dropped, as the SSE specification says.
type sseReader struct {
	br      *bufio.Reader
	data    []byte // data of the pending event, lines joined with \n
	event   []byte // event field of the pending event
	comment []byte // payload of the last server-timing comment
	long    []byte // scratch for lines longer than the buffer
	pending bool   // the pending event had a data or event field
	reset   bool   // data/event belong to the last dispatched event
}

func newSSEReader(r io.Reader) *sseReader {
	return &sseReader{br: bufio.NewReaderSize(r, 4<<10)} // longer lines take the slow path
}

// next reads until an event is dispatched or a server-timing comment is
// seen. The returned bytes (data, event, comment) are valid until the next
// call. At the end of the stream it returns io.EOF, or the read error.
func (s *sseReader) next() (sseKind, error) {
	if s.reset {
		s.data, s.event, s.pending, s.reset = s.data[:0], s.event[:0], false, false
	}
	for {
		line, err := s.readLine()
		if err != nil {
			return 0, err
		}
		if len(line) == 0 {
			if !s.pending {
				continue
			}
			if n := len(s.data); n > 0 {
				s.data = s.data[:n-1] // the last data line's \n
			}
			s.reset = true
			return sseEvent, nil
		}
		if line[0] == ':' {
			if p, ok := timingComment(line[1:]); ok {
				s.comment = append(s.comment[:0], p...)
				return sseTiming, nil
			}
			continue
		}
		if err := s.field(line); err != nil {
			return 0, err
		}
	}
}

// field applies one "name: value" line to the pending event.
func (s *sseReader) field(line []byte) error {
	name, value, _ := bytes.Cut(line, []byte{':'})
	if len(value) > 0 && value[0] == ' ' {
		value = value[1:]
	}
	switch {
	case string(name) == "data": // comparisons of string(b) do not allocate
		if len(s.data)+len(value) >= maxEventSize {
			return errEventTooLarge
		}
		s.data = append(append(s.data, value...), '\n')
		s.pending = true
	case string(name) == "event":
		s.event = append(s.event[:0], value...)
		s.pending = true
	}
	return nil
}

var timingPrefix = []byte("server-timing")

// timingComment recognises the payload of a ": server-timing <metrics>"
// comment line (case-insensitive name, optional colon after it).
func timingComment(c []byte) ([]byte, bool) {
	c = bytes.TrimLeft(c, " \t")
	if len(c) < len(timingPrefix) || !bytes.EqualFold(c[:len(timingPrefix)], timingPrefix) {
		return nil, false
	}
	rest := c[len(timingPrefix):]
	if len(rest) > 0 && rest[0] == ':' {
		rest = rest[1:]
	} else if len(rest) > 0 && rest[0] != ' ' && rest[0] != '\t' {
		return nil, false
	}
	return bytes.TrimSpace(rest), true
}

// readLine returns the next line without its LF or CRLF.
func (s *sseReader) readLine() ([]byte, error) {
	line, err := s.br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		s.long = append(s.long[:0], line...)
		for errors.Is(err, bufio.ErrBufferFull) {
			if len(s.long) > maxEventSize {
				return nil, errEventTooLarge
			}
			line, err = s.br.ReadSlice('\n')
			s.long = append(s.long, line...)
		}
		line = s.long
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, io.EOF // a line without its end is incomplete
		}
		return nil, fmt.Errorf("reading event stream: %w", err)
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}
