package proxy

import (
	"net/http/httptest"
	"testing"
	"time"
)

// With tracing off, the hooks on the per-request path (start, trace id for
// the access log, end) allocate nothing, with or without a client
// traceparent.
func TestTraceOffAllocatesNothing(t *testing.T) {
	h := &Handler{}
	for _, tp := range []string{"", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"} {
		r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
		if tp != "" {
			r.Header.Set("Traceparent", tp)
		}
		x := &exchange{h: h, r: r, start: time.Now()}
		var id string
		allocs := testing.AllocsPerRun(100, func() {
			x.startTrace()
			id = x.traceID()
			x.endTrace(time.Now())
		})
		if allocs != 0 || x.trace != nil {
			t.Errorf("traceparent %q: %v allocations per request, trace %v; want none", tp, allocs, x.trace)
		}
		if tp != "" && id != "0af7651916cd43dd8448eb211c80319c" {
			t.Errorf("trace id %q; want the client's", id)
		}
	}
}

// hexIs matches the lower-case hex of the bytes only, so the access log's
// trace id is the client's header substring only when it is the span's.
func TestTraceHexIs(t *testing.T) {
	b := []byte{0x4b, 0xf9, 0x00, 0xa0}
	for _, c := range []struct {
		h    string
		want bool
	}{{"4bf900a0", true}, {"4BF900A0", false}, {"4bf900a1", false}, {"4bf900", false}, {"4bf900a000", false}} {
		if got := hexIs(c.h, b); got != c.want {
			t.Errorf("hexIs(%q) = %v; want %v", c.h, got, c.want)
		}
	}
}
