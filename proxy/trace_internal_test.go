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
