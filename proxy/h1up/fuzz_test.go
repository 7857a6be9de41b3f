package h1up

import (
	"bufio"
	"bytes"
	"net/http"
	"testing"
)

// FuzzResponse feeds arbitrary bytes to the head parser and the body
// framing: no panic, no body larger than its input, and a Content-Length
// body never yields more than its length.
func FuzzResponse(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
		"HTTP/1.0 200 OK\r\n\r\nbody",
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c := &conn{br: bufio.NewReaderSize(bytes.NewReader(data), 256)}
		b := &Body{c: c}
		req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1/", nil)
		resp, err := readResponse(c, req, b)
		if err != nil {
			return
		}
		total := 0
		p := make([]byte, 7)
		for range len(data) + 2 {
			if b.mode == modeNone {
				break
			}
			n, done, err := b.read(p)
			total += n
			if err != nil || done {
				break
			}
		}
		if total > len(data) {
			t.Fatalf("body of %d bytes from %d bytes of input", total, len(data))
		}
		if b.mode == modeLength && int64(total) > resp.ContentLength {
			t.Fatalf("body of %d bytes with Content-Length %d", total, resp.ContentLength)
		}
	})
}
