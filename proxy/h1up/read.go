package h1up

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// readResponse reads a response head for req from c's reader, skipping
// interim (1xx) responses, and sets b's framing from it. It refuses heads
// whose framing is ambiguous (see ErrMalformedResponse).
func readResponse(c *conn, req *http.Request, b *Body) (*http.Response, error) {
	if _, err := c.br.Peek(1); err != nil {
		return nil, &errNoResponse{err}
	}
	tp := textproto.Reader{R: c.br}
	for {
		line, err := c.br.ReadSlice('\n')
		if err != nil {
			if err == bufio.ErrBufferFull {
				err = errors.New("status line too long")
			}
			return nil, fmt.Errorf("h1up: reading status line: %w", err)
		}
		resp, err := parseStatus(line)
		if err != nil {
			return nil, err
		}
		mh, ok := readFields(c.br)
		if !ok {
			h, err := tp.ReadMIMEHeader()
			if err != nil {
				return nil, fmt.Errorf("%w: header: %w", ErrMalformedResponse, err)
			}
			mh = http.Header(h)
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			return nil, fmt.Errorf("%w: 101 Switching Protocols is not supported", ErrMalformedResponse)
		}
		if resp.StatusCode < 200 {
			continue // interim: 100 Continue, 103 Early Hints
		}
		for k := range mh {
			if !httpguts.ValidHeaderFieldName(k) { // "Content-Length : 5" must not pass for another field
				return nil, fmt.Errorf("%w: header name %q", ErrMalformedResponse, k)
			}
		}
		resp.Header = mh
		resp.Request = req
		if err := frame(resp, req, b); err != nil {
			return nil, err
		}
		return resp, nil
	}
}

// parseStatus parses a status line, "HTTP/1.1 200 OK\r\n". The common
// protocol and status strings are constants, not copies.
func parseStatus(line []byte) (*http.Response, error) {
	line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
	proto, status, ok := bytes.Cut(line, []byte(" "))
	if !ok || len(proto) != len("HTTP/1.1") || string(proto[:7]) != "HTTP/1." || (proto[7] != '0' && proto[7] != '1') {
		return nil, fmt.Errorf("%w: status line %q", ErrMalformedResponse, line)
	}
	status = bytes.TrimLeft(status, " ")
	code, ok := parseCode(status)
	if !ok {
		return nil, fmt.Errorf("%w: status %q", ErrMalformedResponse, status)
	}
	resp := &http.Response{StatusCode: code, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}
	if proto[7] == '0' {
		resp.Proto, resp.ProtoMinor = "HTTP/1.0", 0
	}
	if code == http.StatusOK && string(status) == "200 OK" {
		resp.Status = "200 OK"
	} else {
		resp.Status = string(status)
	}
	return resp, nil
}

// parseCode reads the three-digit status code at the start of s, followed
// by the end or a space.
func parseCode(s []byte) (int, bool) {
	if len(s) < 3 || (len(s) > 3 && s[3] != ' ') {
		return 0, false
	}
	code := 0
	for i := 0; i < 3; i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		code = code*10 + int(s[i]-'0')
	}
	return code, code >= 100
}

// frame sets resp's and b's body framing from the head (RFC 9112 §6.3),
// refusing the ambiguous heads a smuggled response would need.
func frame(resp *http.Response, req *http.Request, b *Body) error {
	h := resp.Header
	te, hasTE := h["Transfer-Encoding"]
	cls, hasCL := h["Content-Length"]
	var cl int64 = -1
	if hasCL {
		n, err := contentLength(cls)
		if err != nil {
			return err
		}
		cl = n
	}
	if hasTE {
		if hasCL {
			return fmt.Errorf("%w: both Transfer-Encoding and Content-Length", ErrMalformedResponse)
		}
		if len(te) != 1 || !strings.EqualFold(strings.TrimSpace(te[0]), "chunked") {
			return fmt.Errorf("%w: transfer coding %q (only chunked is accepted)", ErrMalformedResponse, strings.Join(te, ", "))
		}
		if resp.ProtoMinor == 0 {
			return fmt.Errorf("%w: Transfer-Encoding in an HTTP/1.0 response", ErrMalformedResponse)
		}
	}
	b.keep = resp.ProtoMinor == 1 && !req.Close && !hasToken(h["Connection"], "close") &&
		!hasToken(req.Header["Connection"], "close")
	code := resp.StatusCode
	switch {
	case req.Method == http.MethodHead || code == http.StatusNoContent || code == http.StatusNotModified:
		b.mode = modeNone
		resp.ContentLength = cl
		if code != http.StatusOK || req.Method != http.MethodHead {
			resp.ContentLength = 0
		}
		if hasTE { // a body-less answer's framing is only informational
			resp.ContentLength = -1
		}
	case hasTE:
		b.mode = modeChunked
		resp.ContentLength = -1
		resp.TransferEncoding = []string{"chunked"}
		delete(h, "Transfer-Encoding") // as net/http: the field moves to TransferEncoding
	case hasCL:
		b.mode, b.remaining = modeLength, cl
		resp.ContentLength = cl
		if cl == 0 {
			b.mode = modeNone
		}
	default:
		b.mode, b.keep = modeClose, false
		resp.ContentLength = -1
	}
	resp.Close = !b.keep
	return nil
}

// contentLength parses the Content-Length field lines: every value the
// same decimal number.
func contentLength(vs []string) (int64, error) {
	first := strings.TrimSpace(vs[0])
	for _, v := range vs[1:] {
		if strings.TrimSpace(v) != first {
			return 0, fmt.Errorf("%w: differing Content-Length values %q", ErrMalformedResponse, vs)
		}
	}
	if first == "" || len(first) > 18 {
		return 0, fmt.Errorf("%w: Content-Length %q", ErrMalformedResponse, first)
	}
	var n int64
	for i := 0; i < len(first); i++ {
		c := first[i]
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%w: Content-Length %q", ErrMalformedResponse, first)
		}
		n = n*10 + int64(c-'0')
	}
	return n, nil
}

// hasToken reports whether a comma-separated header contains tok
// (case-insensitively).
func hasToken(vs []string, tok string) bool {
	for _, v := range vs {
		for v != "" {
			var part string
			part, v, _ = strings.Cut(v, ",")
			if strings.EqualFold(strings.TrimSpace(part), tok) {
				return true
			}
		}
	}
	return false
}
