package chunked

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/http/httputil"
	"testing"
)

// encode chunks payload with net/http's own writer, in pieces of size k.
func encode(t testing.TB, payload []byte, k int, trailer string) []byte {
	var b bytes.Buffer
	w := httputil.NewChunkedWriter(&b)
	for len(payload) > 0 {
		n := min(k, len(payload))
		w.Write(payload[:n])
		payload = payload[n:]
	}
	w.Close()
	b.WriteString(trailer)
	b.WriteString("\r\n")
	return b.Bytes()
}

// TestDecodeEverySplit feeds a body encoded by net/http in every two-piece
// split and checks the payload, the end and the bytes left over.
func TestDecodeEverySplit(t *testing.T) {
	payload := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
	for _, trailer := range []string{"", "Server-Timing: total;dur=3\r\nX-A: b\r\n"} {
		wire := append(encode(t, payload, 7, trailer), "NEXT"...)
		for cut := 0; cut <= len(wire); cut++ {
			var d Decoder
			src := bytes.Clone(wire)
			out, n1, done1, err := d.Decode(nil, src[:cut])
			if err != nil {
				t.Fatalf("cut %d: %v", cut, err)
			}
			var n2 int
			var done bool
			if !done1 {
				out, n2, done, err = d.Decode(out, src[cut:])
				if err != nil {
					t.Fatalf("cut %d: %v", cut, err)
				}
				n2 += cut
			} else {
				done, n2 = true, n1
			}
			if !done || !d.Done() {
				t.Fatalf("cut %d: not done", cut)
			}
			if !bytes.Equal(out, payload) {
				t.Fatalf("cut %d: payload %q", cut, out)
			}
			if got := string(wire[n2:]); got != "NEXT" {
				t.Fatalf("cut %d: left %q, want NEXT", cut, got)
			}
		}
	}
}

// TestDecodeInPlace decodes into the input's own storage.
func TestDecodeInPlace(t *testing.T) {
	payload := bytes.Repeat([]byte("abcdefghij"), 100)
	wire := encode(t, payload, 13, "")
	out, n, done, err := new(Decoder).Decode(wire[:0], wire)
	if err != nil || !done || n != len(wire) || !bytes.Equal(out, payload) {
		t.Fatalf("in place: err %v done %v n %d/%d equal %v", err, done, n, len(wire), bytes.Equal(out, payload))
	}
}

func TestDecodeMalformed(t *testing.T) {
	for _, in := range []string{
		"x\r\n", "\r\n", "5\r\nhelloX\r\n", "5\rX", "11111111111111111\r\n", "5\r\nhello\r\n0\r\n\rX",
	} {
		if _, _, _, err := new(Decoder).Decode(nil, []byte(in)); err == nil {
			t.Errorf("%q: decoded without error", in)
		}
	}
	long := append([]byte("5;"), bytes.Repeat([]byte("e"), MaxLine)...)
	if _, _, _, err := new(Decoder).Decode(nil, long); err != ErrLineTooLong {
		t.Errorf("long extension: err %v, want ErrLineTooLong", err)
	}
}

// TestEncodeReadByNetHTTP checks AppendChunk and AppendLast against
// net/http's chunked reader and its trailer parsing.
func TestEncodeReadByNetHTTP(t *testing.T) {
	var wire []byte
	wire = AppendChunk(wire, []byte("data: a\n\n"))
	wire = AppendChunk(wire, nil)
	wire = AppendChunk(wire, []byte("data: [DONE]\n\n"))
	wire = AppendLast(wire, http.Header{"Server-Timing": {"total;dur=1.5"}})
	resp := "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: Server-Timing\r\n\r\n" + string(wire)
	r, err := http.ReadResponse(bufio.NewReader(bytes.NewReader([]byte(resp))), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	if string(body) != "data: a\n\ndata: [DONE]\n\n" {
		t.Fatalf("body %q", body)
	}
	if got := r.Trailer.Get("Server-Timing"); got != "total;dur=1.5" {
		t.Fatalf("trailer %q", got)
	}
}

// FuzzDecode compares the decoder with net/http's chunked reader on
// arbitrary input, fed in two pieces.
func FuzzDecode(f *testing.F) {
	f.Add([]byte("5\r\nhello\r\n0\r\n\r\n"), 3)
	f.Add([]byte("3;ext=1\r\nabc\r\n0\r\nA: b\r\n\r\n"), 9)
	f.Fuzz(func(t *testing.T, in []byte, cut int) {
		want, werr := io.ReadAll(httputil.NewChunkedReader(bytes.NewReader(in)))
		if cut < 0 || cut > len(in) {
			cut = len(in) / 2
		}
		var d Decoder
		out, _, done, err := d.Decode(nil, in[:cut])
		if err == nil && !done {
			out, _, done, err = d.Decode(out, in[cut:])
		}
		if werr == nil && err == nil && done && !bytes.Equal(out, want) {
			t.Fatalf("payload %q, net/http %q", out, want)
		}
	})
}
