package listen

import (
	"bytes"
	"io"
	"net/http"
	"net/url"
	"strings"
	"unsafe"

	"golang.org/x/net/http/httpguts"

	"github.com/sluice-proxy/sluice/internal/httpsyntax"
)

// The own HTTP/1.1 server's request-head parser (RFC 9112 sections 3 and
// 5). It takes the common request whole from the read buffer and builds
// the *http.Request with few allocations: one copy of the head that every
// string (method, target, field names and values) is sliced from, field
// names canonicalized in that copy, one header map sized once and one
// backing array for the values. Anything it does not take — a head that
// net/http would refuse or answer with an error, or one it would read
// differently from the plain case (obs-fold, a bare LF, Transfer-Encoding,
// Content-Length more than once or not plain digits, Host more than once
// or missing on HTTP/1.1, Pragma, a target not in origin form, CONNECT,
// PRI, a version other than 1.0 or 1.1, a head past the read buffer) — is
// left unread in the buffer for net/http's parser (readRequest), which
// reads it and answers exactly as net/http's server does. So every
// refusal is net/http's, and what the fast parser takes it parses as
// net/http would (h1parse_test.go compares both on the same inputs).

// headResult is what parseHead made of the buffered bytes.
type headResult int

const (
	headOK    headResult = iota // a request, parsed
	headMore                    // no head's end yet and nothing the fast parser refuses
	headOther                   // for net/http's parser
)

// parsedHead is a request head as parseHead read it.
type parsedHead struct {
	method, target, host string
	minor                int // 0 or 1
	contentLength        int64
	close                bool
	header               http.Header
	url                  *url.URL
}

// parseHead parses the request head at the start of p. With headOK it
// returns the head's length (its final empty line included) in n. A
// target that needs no unescaping is parsed into u (h.url is then u).
func parseHead(p []byte, h *parsedHead, u *url.URL) (n int, res headResult) {
	// Find the head's end, line by line: every line ends in CRLF (a bare
	// LF is net/http's to read), and the head ends at the first empty one.
	lines, end := 0, 0
	for {
		i := bytes.IndexByte(p[end:], '\n')
		if i < 0 {
			return 0, headMore
		}
		if i == 0 || p[end+i-1] != '\r' {
			return 0, headOther
		}
		if i == 1 {
			if lines == 0 {
				return 0, headOther // an empty request line
			}
			end += 2
			break
		}
		lines++
		end += i + 1
	}
	// One copy of the head (without its empty line) that every string is
	// sliced from; field names are canonicalized in it before it becomes
	// a string.
	b := make([]byte, end-2)
	copy(b, p)

	// The request line: method SP request-target SP HTTP-version.
	line, rest := cutLine(b)
	sp := bytes.IndexByte(line, ' ')
	if sp <= 0 {
		return 0, headOther
	}
	for _, c := range line[:sp] {
		if !httpsyntax.TokenByte[c] {
			return 0, headOther
		}
	}
	tgt := line[sp+1:]
	sp2 := bytes.IndexByte(tgt, ' ')
	if sp2 <= 0 || tgt[0] != '/' {
		return 0, headOther
	}
	switch string(tgt[sp2+1:]) {
	case "HTTP/1.1":
		h.minor = 1
	case "HTTP/1.0":
		h.minor = 0
	default:
		return 0, headOther
	}
	switch string(line[:sp]) {
	case "CONNECT", "PRI":
		return 0, headOther
	}

	// The fields: validated and canonicalized in place, then the map.
	fields, haveHost, haveLength := lines-1, false, false
	h.contentLength = 0
	for r := rest; len(r) > 0; {
		var l []byte
		l, r = cutLine(r)
		colon := bytes.IndexByte(l, ':')
		if colon <= 0 {
			return 0, headOther // no name, or obs-fold's leading whitespace
		}
		if !httpsyntax.CanonField(l, colon) {
			return 0, headOther
		}
		switch string(l[:colon]) {
		case "Host":
			if haveHost {
				return 0, headOther
			}
			haveHost = true
			fields--
		case "Content-Length":
			if haveLength {
				return 0, headOther
			}
			haveLength = true
			v := trimOWS(l[colon+1:])
			if len(v) == 0 || len(v) > 18 {
				return 0, headOther
			}
			for _, c := range v {
				if c < '0' || c > '9' {
					return 0, headOther
				}
				h.contentLength = h.contentLength*10 + int64(c-'0')
			}
		case "Transfer-Encoding", "Pragma":
			return 0, headOther
		}
	}
	if !haveHost && h.minor == 1 {
		return 0, headOther
	}

	// b is not written after this.
	s := unsafe.String(unsafe.SliceData(b), len(b))
	h.method = s[:sp]
	h.target = s[sp+1 : sp+1+sp2]
	if simpleTarget(h.target, u) {
		h.url = u
	} else {
		pu, err := url.ParseRequestURI(h.target)
		if err != nil {
			return 0, headOther
		}
		h.url = pu
	}
	h.header = make(http.Header, fields)
	vals := make([]string, fields)
	h.host = ""
	off := len(line) + 2
	for r := rest; len(r) > 0; {
		var l []byte
		l, r = cutLine(r)
		colon := bytes.IndexByte(l, ':')
		v0, v1 := valueBounds(l, colon+1)
		key, val := s[off:off+colon], s[off+v0:off+v1]
		off += len(l) + 2
		if key == "Host" {
			if !httpguts.ValidHostHeader(val) {
				return 0, headOther
			}
			h.host = val
			continue
		}
		if vv, ok := h.header[key]; ok {
			h.header[key] = append(vv, val)
			continue
		}
		vals[0] = val
		h.header[key] = vals[:1:1]
		vals = vals[1:]
	}
	conn := h.header["Connection"]
	if h.minor == 0 {
		h.close = httpguts.HeaderValuesContainsToken(conn, "close") || !httpguts.HeaderValuesContainsToken(conn, "keep-alive")
	} else {
		h.close = httpguts.HeaderValuesContainsToken(conn, "close")
	}
	return end, headOK
}

// pathByte: the bytes net/url's ParseRequestURI leaves in a path as they
// are, with no RawPath (no escape, nothing escape would write otherwise).
var pathByte = httpsyntax.AlnumAnd("-_.~$&+,/:;=@")

// simpleTarget parses an origin-form target into u as url.ParseRequestURI
// would, when its path is made of pathByte only and its query has no
// control byte; else it reports false.
func simpleTarget(t string, u *url.URL) bool {
	path, query := t, ""
	if q := strings.IndexByte(t, '?'); q >= 0 {
		if q == len(t)-1 {
			return false // ParseRequestURI's ForceQuery
		}
		path, query = t[:q], t[q+1:]
	}
	for i := 0; i < len(path); i++ {
		if !pathByte[path[i]] {
			return false
		}
	}
	for i := 0; i < len(query); i++ {
		if c := query[i]; c < ' ' || c == 0x7f {
			return false
		}
	}
	*u = url.URL{Path: path, RawQuery: query}
	return true
}

// cutLine cuts b at its first CRLF (b's last line has none).
func cutLine(b []byte) (line, rest []byte) {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return b, nil
	}
	return b[:i-1], b[i+1:]
}

// valueBounds returns where the field value starting at from ends, its
// surrounding whitespace cut.
func valueBounds(l []byte, from int) (int, int) {
	i, j := from, len(l)
	for i < j && (l[i] == ' ' || l[i] == '\t') {
		i++
	}
	for j > i && (l[j-1] == ' ' || l[j-1] == '\t') {
		j--
	}
	return i, j
}

func trimOWS(v []byte) []byte {
	i, j := valueBounds(v, 0)
	return v[i:j]
}

// request builds the *http.Request of a parsed head (its Body set by the
// caller).
func (h *parsedHead) request() http.Request {
	proto := "HTTP/1.1"
	if h.minor == 0 {
		proto = "HTTP/1.0"
	}
	return http.Request{
		Method:        h.method,
		URL:           h.url,
		Proto:         proto,
		ProtoMajor:    1,
		ProtoMinor:    h.minor,
		Header:        h.header,
		ContentLength: h.contentLength,
		Close:         h.close,
		Host:          h.host,
		RequestURI:    h.target,
	}
}

// lengthBody is a request body of declared length, read from the
// connection's buffer (net/http's body over an io.LimitReader, without
// their allocations): io.EOF with its last byte, io.ErrUnexpectedEOF if
// the connection ends before it.
type lengthBody struct{ limitReader }

func (b *lengthBody) Read(p []byte) (int, error) {
	n, err := b.limitReader.Read(p)
	if b.remain <= 0 {
		return n, io.EOF
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (b *lengthBody) Close() error { return nil }
