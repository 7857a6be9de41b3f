package h1up

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/textproto"
	"reflect"
	"testing"
)

// compareFields reads in's field lines with readFields and, when it takes
// them, with textproto's ReadMIMEHeader: the same map and the same bytes
// left after them.
func compareFields(t *testing.T, in []byte) bool {
	t.Helper()
	br := bufio.NewReaderSize(bytes.NewReader(in), 4096)
	br.Peek(1)
	got, ok := readFields(br)
	if !ok {
		if br.Buffered() != min(len(in), 4096) {
			t.Fatalf("%q: not taken, but %d bytes read", in, min(len(in), 4096)-br.Buffered())
		}
		return false
	}
	gotRest, _ := io.ReadAll(br)
	ref := bufio.NewReaderSize(bytes.NewReader(in), 4096)
	want, err := textproto.NewReader(ref).ReadMIMEHeader()
	if err != nil {
		t.Fatalf("%q: taken; ReadMIMEHeader: %v", in, err)
	}
	wantRest, _ := io.ReadAll(ref)
	if !reflect.DeepEqual(got, http.Header(want)) || !bytes.Equal(gotRest, wantRest) {
		t.Fatalf("%q:\ngot  %q, rest %q\nwant %q, rest %q", in, got, gotRest, want, wantRest)
	}
	return true
}

var fieldCases = []struct {
	in   string
	take bool
}{
	{"Content-Length: 5\r\nContent-Type: application/json\r\nx-request-id: a\r\nX-Request-Id:  b \t\r\nDate: x\r\n\r\nhello", true},
	{"\r\n", true},
	{"E:\r\n\r\n", true},
	{"caf: \xc3\xa9\r\n\r\n", true},
	{"A: 1\r\n", false},           // not whole
	{"A: 1\n\n", false},           // bare LF
	{"A: 1\r\n b\r\n\r\n", false}, // obs-fold
	{" A: 1\r\n\r\n", false},
	{"A : 1\r\n\r\n", false},
	{"A\r\n\r\n", false},
	{": 1\r\n\r\n", false},
	{"A: \x01\r\n\r\n", false},
	{"A: \x7f\r\n\r\n", false},
	{"A: b\rc\r\n\r\n", false},
}

func TestReadFieldsAgainstTextproto(t *testing.T) {
	for _, tc := range fieldCases {
		if got := compareFields(t, []byte(tc.in)); got != tc.take {
			t.Errorf("%q: taken %v; want %v", tc.in, got, tc.take)
		}
	}
}

func TestReadFieldsAllocs(t *testing.T) {
	in := []byte("Content-Type: application/json\r\nContent-Length: 120\r\nDate: Sat, 05 Dec 2026 10:00:00 GMT\r\nX-Request-Id: 1\r\n\r\n")
	br := bufio.NewReader(nil)
	r := bytes.NewReader(nil)
	allocs := testing.AllocsPerRun(100, func() {
		r.Reset(in)
		br.Reset(r)
		br.Peek(1)
		if _, ok := readFields(br); !ok {
			t.Fatal("not taken")
		}
	})
	if allocs > 4 { // the copy, the map (header and group), the values
		t.Errorf("%.1f allocations; want ≤ 4", allocs)
	}
}

func FuzzReadFields(f *testing.F) {
	for _, tc := range fieldCases {
		f.Add([]byte(tc.in))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		compareFields(t, in)
	})
}
