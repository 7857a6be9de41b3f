package h1up

import (
	"bufio"
	"bytes"
	"net/http"
	"strings"
	"unsafe"

	"github.com/sluice-proxy/sluice/internal/httpsyntax"
)

// readFields reads a head's field lines when they are all in br's buffer
// and plain (CRLF line ends, no obs-fold, token names, field-value bytes),
// as net/textproto's ReadMIMEHeader would (names canonicalized, values
// trimmed, repeated names appended), with fewer allocations: one copy of
// the fields that every name and value is sliced from, one map, one array
// of values. ok false: nothing was read, and ReadMIMEHeader reads them.
func readFields(br *bufio.Reader) (h http.Header, ok bool) {
	p, _ := br.Peek(br.Buffered())
	lines, end := 0, 0
	for {
		i := bytes.IndexByte(p[end:], '\n')
		if i <= 0 || p[end+i-1] != '\r' {
			return nil, false
		}
		if i == 1 {
			break
		}
		lines++
		end += i + 1
	}
	b := make([]byte, end)
	copy(b, p)
	for r := b; len(r) > 0; {
		i := bytes.IndexByte(r, '\n')
		l := r[:i-1]
		r = r[i+1:]
		colon := bytes.IndexByte(l, ':')
		if colon <= 0 {
			return nil, false
		}
		if !httpsyntax.CanonField(l, colon) {
			return nil, false
		}
	}
	s := unsafe.String(unsafe.SliceData(b), len(b)) // b is not written after this
	h = make(http.Header, lines)
	vals := make([]string, lines)
	for off := 0; off < len(s); {
		i := bytes.IndexByte(b[off:], '\n')
		l := s[off : off+i-1]
		off += i + 1
		colon := strings.IndexByte(l, ':')
		v0, v1 := colon+1, len(l)
		for v0 < v1 && (l[v0] == ' ' || l[v0] == '\t') {
			v0++
		}
		for v1 > v0 && (l[v1-1] == ' ' || l[v1-1] == '\t') {
			v1--
		}
		key, val := l[:colon], l[v0:v1]
		if vv, ok := h[key]; ok {
			h[key] = append(vv, val)
			continue
		}
		vals[0] = val
		h[key] = vals[:1:1]
		vals = vals[1:]
	}
	br.Discard(end + 2)
	return h, true
}
