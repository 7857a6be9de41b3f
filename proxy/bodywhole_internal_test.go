package proxy

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// deadlineRecorder is a ResponseWriter whose ResponseController read
// deadlines are counted.
type deadlineRecorder struct {
	*httptest.ResponseRecorder
	sets int
}

func (d *deadlineRecorder) SetReadDeadline(time.Time) error { d.sets++; return nil }

// wholeBody is a request body that says whether it is whole in the
// server's buffer (listen's h1Body.Whole).
type wholeBody struct {
	io.Reader
	whole bool
}

func (*wholeBody) Close() error  { return nil }
func (b *wholeBody) Whole() bool { return b.whole }

// TestReadBodyWholeSetsNoDeadline: readBody sets no read deadline (and no
// timer) for a body that is whole in the server's buffer, and sets and
// clears one for a body that is not; both are read whole.
func TestReadBodyWholeSetsNoDeadline(t *testing.T) {
	lim := bodyLimits{max: 1 << 20, timeout: time.Second, minRate: 0, budget: 1 << 30}
	for _, whole := range []bool{true, false} {
		d := &deadlineRecorder{ResponseRecorder: httptest.NewRecorder()}
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Body = &wholeBody{Reader: bytes.NewReader([]byte(`{"model":"m"}`)), whole: whole}
		r.ContentLength = 13
		body, _, err := readBody(d, r, lim, new(bodyBudget), time.Now())
		if err != nil || string(body) != `{"model":"m"}` {
			t.Fatalf("whole %v: body %q, %v", whole, body, err)
		}
		if want := map[bool]int{true: 0, false: 2}[whole]; d.sets != want {
			t.Fatalf("whole %v: %d read deadlines set; want %d", whole, d.sets, want)
		}
	}
}
