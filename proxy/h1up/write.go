package h1up

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"golang.org/x/net/http/httpguts"

	"github.com/sluice-proxy/sluice/internal/chunked"
)

// errBodyLength reports a request body that does not match its
// ContentLength: sending it would desynchronize the connection.
var errBodyLength = errors.New("h1up: request body length differs from ContentLength")

// writeRequest writes req's head and body to w through a pooled writer.
// The body is read to its end (io.EOF), so wrappers that watch for the end
// of the body see it. The last flush is marked (w.last): a request whole
// in the writer's buffer is sent by it alone.
func (t *Transport) writeRequest(w *reqWriter, req *http.Request) error {
	bw := t.writers.Get().(*bufio.Writer)
	bw.Reset(w)
	defer func() {
		bw.Reset(nil)
		t.writers.Put(bw)
	}()
	if err := writeHead(bw, req); err != nil {
		return err
	}
	body := req.Body
	if body == nil || body == http.NoBody {
		w.last = true
		return bw.Flush()
	}
	var err error
	if req.ContentLength > 0 {
		err = copyLength(bw, body, req.ContentLength)
	} else {
		err = copyChunked(bw, body)
	}
	if err != nil {
		return err
	}
	w.last = true
	return bw.Flush()
}

// writeHead writes the request line and the header section. Host,
// Content-Length and Transfer-Encoding come from req's fields, not its
// Header, as with net/http.
func writeHead(bw *bufio.Writer, req *http.Request) error {
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	if !validMethod(method) {
		return fmt.Errorf("h1up: invalid method %q", method)
	}
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	if !httpguts.ValidHostHeader(host) {
		return fmt.Errorf("h1up: invalid Host %q", host)
	}
	target := req.URL.RequestURI()
	bw.WriteString(method)
	bw.WriteByte(' ')
	bw.WriteString(target)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(host)
	bw.WriteString("\r\n")
	for k, vs := range req.Header {
		switch k {
		case "Host", "Content-Length", "Transfer-Encoding", "Trailer":
			continue
		}
		if !httpguts.ValidHeaderFieldName(k) {
			return fmt.Errorf("h1up: invalid header name %q", k)
		}
		for _, v := range vs {
			if !httpguts.ValidHeaderFieldValue(v) {
				return fmt.Errorf("h1up: invalid value for header %q", k)
			}
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	if _, ok := req.Header["User-Agent"]; !ok {
		bw.WriteString("User-Agent: Go-http-client/1.1\r\n") // as net/http
	}
	if req.Close {
		bw.WriteString("Connection: close\r\n")
	}
	switch body := req.Body; {
	case body == nil || body == http.NoBody:
		switch method {
		case http.MethodPost, http.MethodPut, http.MethodPatch:
			bw.WriteString("Content-Length: 0\r\n")
		}
	case req.ContentLength > 0:
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(bw.AvailableBuffer(), req.ContentLength, 10)) // (a local array escaped through Write)
		bw.WriteString("\r\n")
	default: // unknown length (-1, or 0 with a body, as net/http reads it)
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	}
	_, err := bw.WriteString("\r\n")
	return err
}

func validMethod(m string) bool {
	for i := 0; i < len(m); i++ {
		if !httpguts.IsTokenRune(rune(m[i])) {
			return false
		}
	}
	return m != ""
}

// copyLength copies exactly n bytes of body and then reads it to io.EOF.
// It reads straight into bw's free space (what bw.ReadFrom of an
// io.LimitReader would do, without the reader's allocation per request).
func copyLength(bw *bufio.Writer, body io.Reader, n int64) error {
	for got := int64(0); got < n; {
		if bw.Available() == 0 {
			if err := bw.Flush(); err != nil {
				return fmt.Errorf("h1up: writing request body: %w", err)
			}
		}
		buf := bw.AvailableBuffer()
		buf = buf[:min(int64(cap(buf)), n-got)]
		k, err := body.Read(buf)
		if k > 0 {
			bw.Write(buf[:k]) // in place: buf is bw's own free space
			got += int64(k)
		}
		if err == io.EOF {
			if got != n {
				return errBodyLength
			}
			break
		}
		if err != nil {
			return fmt.Errorf("h1up: reading request body: %w", err)
		}
	}
	if bw.Available() == 0 {
		if err := bw.Flush(); err != nil {
			return fmt.Errorf("h1up: writing request body: %w", err)
		}
	}
	one := bw.AvailableBuffer()[:1] // read into free space and not written: no [1]byte escaping to the heap
	for {
		k, err := body.Read(one)
		if k > 0 {
			return errBodyLength
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("h1up: reading request body: %w", err)
		}
	}
}

// copyChunked copies body in chunked coding up to io.EOF, then the last
// chunk.
func copyChunked(bw *bufio.Writer, body io.Reader) error {
	buf := make([]byte, 4<<10)
	var line [24]byte
	for {
		n, err := body.Read(buf)
		if n > 0 {
			bw.Write(strconv.AppendUint(line[:0], uint64(n), 16))
			bw.WriteString("\r\n")
			bw.Write(buf[:n])
			if _, werr := bw.WriteString("\r\n"); werr != nil {
				return fmt.Errorf("h1up: writing request body: %w", werr)
			}
		}
		if err == io.EOF {
			_, werr := bw.Write(chunked.AppendLast(line[:0], nil))
			return werr
		}
		if err != nil {
			return fmt.Errorf("h1up: reading request body: %w", err)
		}
	}
}
