package listen

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"
)

// compareWithNetHTTP parses in with the fast parser and, when it takes
// the head, with net/http's parser and the server's checks on the same
// bytes: both must accept it, with the same fields, and leave the same
// body and remainder. A head the fast parser leaves for net/http's is not
// compared (net/http's parser is then the one that reads it); one it
// waits for more bytes of must be one net/http's parser cannot finish.
func compareWithNetHTTP(t *testing.T, in []byte) headResult {
	t.Helper()
	var h parsedHead
	n, res := parseHead(bytes.Clone(in), &h, new(url.URL))
	ref, err := readRequest(bufio.NewReaderSize(bytes.NewReader(in), 64<<10))
	if err == nil {
		err = checkRequest(ref)
	}
	switch res {
	case headMore:
		if err == nil {
			t.Fatalf("%q: the fast parser waits for more; net/http's read a request", in)
		}
		return res
	case headOther:
		return res
	}
	if err != nil {
		t.Fatalf("%q: the fast parser took it; net/http's refused it: %v", in, err)
	}
	r := h.request()
	got := &r
	type fields struct {
		Method, RequestURI, Proto, Host string
		Major, Minor                    int
		Close                           bool
		Length                          int64
		TE                              []string
		Trailer                         http.Header
		Header                          http.Header
		URL                             any
	}
	of := func(r *http.Request) fields {
		return fields{r.Method, r.RequestURI, r.Proto, r.Host, r.ProtoMajor, r.ProtoMinor, r.Close,
			r.ContentLength, r.TransferEncoding, r.Trailer, r.Header, *r.URL}
	}
	if g, w := of(got), of(ref); !reflect.DeepEqual(g, w) {
		t.Fatalf("%q:\nfast     %+v\nnet/http %+v", in, g, w)
	}
	// The body and what follows it.
	br := bufio.NewReader(bytes.NewReader(in[n:]))
	var body io.Reader = http.NoBody
	if h.contentLength > 0 {
		body = &lengthBody{limitReader{r: br, remain: h.contentLength}}
	}
	gotBody, gotErr := io.ReadAll(body)
	gotRest, _ := io.ReadAll(br)
	refBR := bufio.NewReaderSize(bytes.NewReader(in), 64<<10)
	ref, _ = readRequest(refBR)
	wantBody, wantErr := io.ReadAll(ref.Body)
	wantRest, _ := io.ReadAll(refBR)
	if !bytes.Equal(gotBody, wantBody) || !errors.Is(gotErr, wantErr) && gotErr != wantErr ||
		!bytes.Equal(gotRest, wantRest) {
		t.Fatalf("%q: body %q (%v), rest %q; net/http's %q (%v), %q", in, gotBody, gotErr, gotRest, wantBody, wantErr, wantRest)
	}
	return res
}

// parseCases are heads with the result the fast parser must give.
var parseCases = []struct {
	in   string
	want headResult
}{
	{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", headOK},
	{"GET /v1/chat/completions?a=1&b=%20 HTTP/1.1\r\nHost: api.example:8080\r\nauthorization: Bearer k\r\ncontent-type: application/json\r\naCCEPT: */*\r\nUser-Agent: t/1\r\n\r\n", headOK},
	{"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET / HTTP/1.1\r\n", headOK},
	{"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length:   007 \r\n\r\nhelloXX", headOK},
	{"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\nshort", headOK},
	{"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", headOK},
	{"GET /a%2Fb/c%zz HTTP/1.1\r\nHost: x\r\n\r\n", headOther}, // a bad escape: net/http's error
	{"GET /a%2Fb HTTP/1.1\r\nHost: x\r\n\r\n", headOK},
	{"GET //x/y HTTP/1.1\r\nHost: x\r\n\r\n", headOK},
	{"GET / HTTP/1.1\r\nHost: x\r\nX: 1\r\nx: 2\r\nX-Y:3\r\nx-y: \t4 \t\r\nEmpty:\r\n\r\n", headOK},
	{"GET / HTTP/1.1\r\nHost:\r\n\r\n", headOK},
	{"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n", headOK},
	{"GET / HTTP/1.0\r\n\r\n", headOK},
	{"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", headOK},
	{"GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n", headOK},
	{"GET / HTTP/1.1\r\nHost: x\r\nConnection: foo, Close\r\n\r\n", headOK},
	{"GET / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nTrailer: X\r\n\r\n", headOK},
	{"GET / HTTP/1.1\r\nHost: x\r\nX: caf\xc3\xa9\r\n\r\n", headOK},
	{"M-SEARCH~ /x HTTP/1.1\r\nHost: x\r\n\r\n", headOK},
	// Left to net/http's parser.
	{"GET / HTTP/1.1\r\n\r\n", headOther},
	{"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", headOther},
	{"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", headOther},
	{"GET / HTTP/1.1\nHost: x\n\n", headOther},
	{"GET / HTTP/1.1\r\nHost: x\n\r\n", headOther},
	{"GET / HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n", headOther},
	{"GET / HTTP/1.1\r\n Host: x\r\n\r\n", headOther},
	{"GET / HTTP/1.1\r\nHost : x\r\n\r\n", headOther},
	{"GET / HTTP/1.1\r\nHost: x\r\nX: a\x01b\r\n\r\n", headOther},
	{"GET / HTTP/1.1\r\nHost: x\r\nX: a\x7fb\r\n\r\n", headOther},
	{"GET / HTTP/1.1\r\nHost: x\r\nX: a\rb\r\n\r\n", headOther},
	{"GET / HTTP/1.1\r\nHost: x\r\nX\r\n\r\n", headOther},
	{"GET / HTTP/1.1\r\nHost: x\r\n: x\r\n\r\n", headOther},
	{"GET / HTTP/1.1\r\nHost: x\r\nX(: x\r\n\r\n", headOther},
	{"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", headOther},
	{"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx", headOther},
	{"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx", headOther},
	{"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +1\r\n\r\nx", headOther},
	{"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1 1\r\n\r\nx", headOther},
	{"POST / HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n\r\n", headOther},
	{"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n", headOther},
	{"GET / HTTP/1.1\r\nHost: x\r\nPragma: no-cache\r\n\r\n", headOther},
	{"GET http://a/ HTTP/1.1\r\nHost: x\r\n\r\n", headOther},
	{"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", headOther},
	{"CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n", headOther},
	{"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", headOther},
	{"GET / HTTP/1.2\r\nHost: x\r\n\r\n", headOther},
	{"GET / HTTP/2.0\r\nHost: x\r\n\r\n", headOther},
	{"GET / http/1.1\r\nHost: x\r\n\r\n", headOther},
	{"GET  / HTTP/1.1\r\nHost: x\r\n\r\n", headOther},
	{"GET / HTTP/1.1 \r\nHost: x\r\n\r\n", headOther},
	{"GET /a b HTTP/1.1\r\nHost: x\r\n\r\n", headOther},
	{"GET /\x00 HTTP/1.1\r\nHost: x\r\n\r\n", headOther},
	{"G(T / HTTP/1.1\r\nHost: x\r\n\r\n", headOther},
	{"\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n", headOther},
	{"GET\r\n\r\n", headOther},
	// Not whole yet.
	{"GET / HTTP/1.1\r\nHost: x\r\n", headMore},
	{"GET / HTTP/1.1\r\nHo", headMore},
	{"", headMore},
}

func TestParseHeadAgainstNetHTTP(t *testing.T) {
	for _, tc := range parseCases {
		if got := compareWithNetHTTP(t, []byte(tc.in)); got != tc.want {
			t.Errorf("%q: result %d; want %d", tc.in, got, tc.want)
		}
	}
}

// TestParseHeadNoAliasing checks that the parsed strings are a copy: the
// read buffer is reused for the next request.
func TestParseHeadNoAliasing(t *testing.T) {
	in := []byte("POST /p?q=1 HTTP/1.1\r\nHost: h\r\nx-key: v\r\n\r\n")
	var h parsedHead
	if _, res := parseHead(in, &h, new(url.URL)); res != headOK {
		t.Fatalf("result %d", res)
	}
	for i := range in {
		in[i] = '#'
	}
	r := h.request()
	if r.Method != "POST" || r.URL.RawQuery != "q=1" || r.Host != "h" || r.Header.Get("X-Key") != "v" {
		t.Fatalf("got %q %q %q %q", r.Method, r.URL.RawQuery, r.Host, r.Header)
	}
	// A value appended to must not overwrite its neighbour's.
	r.Header["X-Key"] = append(r.Header["X-Key"], "w")
	if len(r.Header) != 1 || r.Header.Get("X-Key") != "v" {
		t.Fatalf("header %q", r.Header)
	}
}

func TestParseHeadAllocs(t *testing.T) {
	in := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: sluice-bench\r\n" +
		"Authorization: Bearer k\r\nContent-Type: application/json\r\nAccept: */*\r\nContent-Length: 120\r\n\r\n")
	var h parsedHead
	var u url.URL
	allocs := testing.AllocsPerRun(100, func() {
		if _, res := parseHead(in, &h, &u); res != headOK {
			t.Fatal(res)
		}
	})
	// The head's copy, the map (its header and its group), the values' array,
	// the URL.
	if allocs > 5 {
		t.Errorf("%.1f allocations per head; want ≤ 5", allocs)
	}
}

// TestSimpleTarget: every target simpleTarget takes, url.ParseRequestURI
// parses to the same URL; those with other bytes it leaves to it.
func TestSimpleTarget(t *testing.T) {
	try := func(tgt string) {
		var u url.URL
		ok := simpleTarget(tgt, &u)
		ref, err := url.ParseRequestURI(tgt)
		if ok && (err != nil || *ref != u) {
			t.Fatalf("%q: %+v; ParseRequestURI %+v, %v", tgt, u, ref, err)
		}
	}
	taken := 0
	for c := range 256 {
		for _, f := range []string{"/a%cb", "/a?q=%c", "/%c?", "/?%c?"} {
			try(fmt.Sprintf(f, c))
		}
		var u url.URL
		if simpleTarget(fmt.Sprintf("/a%cb?x%c", c, c), &u) {
			taken++
		}
	}
	if taken != 62+13+1 { // letters, digits, "-_.~$&+,/:;=@", and '?' (it ends the path)
		t.Errorf("%d bytes taken in a path; want %d", taken, 62+13+1)
	}
	for _, tgt := range []string{"/", "/v1/chat/completions", "/a?", "/a??", "/a?b?c", "//x", "/a/../b", "/a;b=c,d@e:f"} {
		try(tgt)
	}
}

func FuzzParseHead(f *testing.F) {
	for _, tc := range parseCases {
		f.Add([]byte(tc.in))
	}
	f.Add([]byte(strings.Repeat("GET / HTTP/1.1\r\nHost: x\r\n\r\n", 2)))
	f.Fuzz(func(t *testing.T, in []byte) {
		compareWithNetHTTP(t, in)
	})
}

func BenchmarkParseHead(b *testing.B) {
	in := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: sluice-bench\r\n" +
		"Authorization: Bearer k\r\nContent-Type: application/json\r\nAccept: */*\r\nContent-Length: 120\r\n\r\n")
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		var u url.URL
		for b.Loop() {
			var h parsedHead
			if _, res := parseHead(in, &h, &u); res != headOK {
				b.Fatal(res)
			}
		}
	})
	b.Run("net-http", func(b *testing.B) {
		b.ReportAllocs()
		br := bufio.NewReader(nil)
		r := bytes.NewReader(nil)
		for b.Loop() {
			r.Reset(in)
			br.Reset(r)
			req, err := readRequest(br)
			if err == nil {
				err = checkRequest(req)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}
