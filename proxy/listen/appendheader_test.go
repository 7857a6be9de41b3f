package listen_test

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"

	"github.com/sluice-proxy/sluice/proxy/listen"
)

// TestAppendHeaderMatchesNetHTTP: AppendHeader writes what net/http's
// Header.Write writes, byte for byte: sorted names, every value, line
// breaks in values made spaces, values trimmed, invalid names left out,
// and more fields than its stack buffer of names holds.
func TestAppendHeaderMatchesNetHTTP(t *testing.T) {
	many := http.Header{}
	for i := range 40 {
		many[fmt.Sprintf("X-Field-%02d", 39-i)] = []string{fmt.Sprint("v", i)}
	}
	for name, h := range map[string]http.Header{
		"empty": {},
		"typical": {
			"Content-Type":        {"text/event-stream"},
			"Server-Timing":       {"net-rtt;dur=0.018, auth;dur=0.007", "ttft;dur=0.287"},
			"X-Request-Id":        {"78ea83619db08b95ebc0b1fc371fc33a"},
			"X-Ratelimit-Limit":   {"100"},
			"Cache-Control":       {"no-cache"},
			"X-Accel-Buffering":   {"no"},
			"Trailer":             {"Server-Timing"},
			"X-Sluice-Request-Id": {"78ea83619db08b95ebc0b1fc371fc33a"},
		},
		"odd values": {
			"A": {"  padded\t", "line\r\nbreak", "\r\nlead", "trail\n", "", "mid\rcr"},
			"B": {"\t \t"},
		},
		"invalid names": {
			"Bad Name": {"x"},
			"X:y":      {"x"},
			"":         {"x"},
			"Ok":       {"y"},
			"Ü":        {"z"},
		},
		"many": many,
	} {
		var want bytes.Buffer
		if err := h.Write(&want); err != nil {
			t.Fatal(err)
		}
		if got := listen.AppendHeader([]byte("HEAD\r\n"), h); string(got) != "HEAD\r\n"+want.String() {
			t.Errorf("%s: AppendHeader wrote\n%q\nnet/http writes\n%q", name, got[6:], want.String())
		}
	}
}
