package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/routing"
)

// upstreamExchange is an exchange ready to build a backend request: a
// client request with the headers an OpenAI SDK sends, on a route whose
// pool has one backend under a base path.
func upstreamExchange(tb testing.TB) (*exchange, *routing.Backend) {
	tb.Helper()
	p, err := routing.NewPool(routing.PoolConfig{Name: "p", Backends: []routing.BackendConfig{{URL: "http://127.0.0.1:9/base/"}}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.Close() })
	route := &routing.Route{RouteConfig: routing.RouteConfig{Name: "r", Pool: "p"}.WithDefaults(), Pool: p}
	r := httptest.NewRequest("POST", "http://edge.example/v1/chat/completions?stream=false", nil)
	r.RemoteAddr = "192.0.2.7:40000"
	for k, v := range map[string]string{
		"Authorization": "Bearer sk-client", "Content-Type": "application/json", "Accept": "application/json",
		"User-Agent": "OpenAI/Python 1.54.0", "X-Stainless-Lang": "python", "X-Stainless-Package-Version": "1.54.0",
		"X-Stainless-Os": "Linux", "X-Stainless-Arch": "x64", "X-Stainless-Runtime": "CPython",
		"X-Stainless-Runtime-Version": "3.12.3", "X-Stainless-Retry-Count": "0", "Accept-Encoding": "gzip, deflate",
		"Connection": "keep-alive, X-Hop", "X-Hop": "1", "X-Forwarded-For": "203.0.113.9", "X-Sluice-Tenant": "forged",
	} {
		r.Header.Set(k, v)
	}
	x := &exchange{r: r, id: "client-id", ownID: "own-id", route: route, policy: &RoutePolicy{},
		body: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)}
	return x, p.Backends()[0]
}

// The backend request carries the backend's base URL plus the client's
// path and query, the backend's host, the client's end-to-end fields and
// Sluice's forwarding fields, without credentials, hop-by-hop fields,
// fields the client's Connection names, or X-Sluice-* fields; and it is
// built in a bounded number of allocations (the header map is sized once,
// Sluice's values share one array).
func TestUpstreamRequestShape(t *testing.T) {
	x, b := upstreamExchange(t)
	req, err := x.upstreamRequest(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := req.URL.String(), "http://127.0.0.1:9/base/v1/chat/completions?stream=false"; got != want {
		t.Errorf("URL %q, want %q", got, want)
	}
	if got := req.URL.RequestURI(); got != "/base/v1/chat/completions?stream=false" {
		t.Errorf("request URI %q", got)
	}
	if req.Host != "127.0.0.1:9" || req.Method != "POST" {
		t.Errorf("host %q method %q", req.Host, req.Method)
	}
	want := map[string]string{
		"X-Forwarded-For": "192.0.2.7", "X-Forwarded-Proto": "http", "X-Forwarded-Host": "edge.example",
		"X-Request-Id": "client-id", "X-Sluice-Request-Id": "own-id", "User-Agent": "OpenAI/Python 1.54.0",
		"X-Stainless-Retry-Count": "0", "Content-Type": "application/json",
		"Authorization": "", "Accept-Encoding": "", "Connection": "", "X-Hop": "", "X-Sluice-Tenant": "",
	}
	for k, v := range want {
		if got := req.Header.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if got := req.Header["X-Forwarded-For"]; len(got) != 1 {
		t.Errorf("X-Forwarded-For %q: the client's value must be replaced, not kept", got)
	}
	// Changing one of Sluice's fields leaves the others alone (they
	// share an array).
	req.Header.Add("X-Forwarded-Proto", "extra")
	req.Header.Set("X-Forwarded-For", "changed")
	if req.Header.Get("X-Forwarded-Host") != "edge.example" || req.Header.Get("X-Request-Id") != "client-id" {
		t.Errorf("fields changed together: %v", req.Header)
	}
	if n := testing.AllocsPerRun(100, func() { x.upstreamRequest(context.Background(), b) }); n > 8 {
		t.Errorf("upstreamRequest: %v allocations, want at most 8", n)
	}
}

// The backend request's body is the client's body as http.NewRequest sets
// a bytes.Reader body: its length, readable once, and GetBody giving the
// same bytes again as often as asked (a retry on a new connection), each
// reader independent; an empty body is http.NoBody.
func TestUpstreamRequestBody(t *testing.T) {
	x, b := upstreamExchange(t)
	want := string(x.body)
	req, err := x.upstreamRequest(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	if req.ContentLength != int64(len(want)) || req.GetBody == nil {
		t.Fatalf("ContentLength %d (want %d), GetBody set %v", req.ContentLength, len(want), req.GetBody != nil)
	}
	got, err := io.ReadAll(req.Body)
	if err != nil || string(got) != want {
		t.Fatalf("body %q, %v; want %q", got, err, want)
	}
	if err := req.Body.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := req.Body.(io.WriterTo); !ok {
		t.Error("body lost WriteTo: the transport would copy it through a buffer")
	}
	r1, _ := req.GetBody()
	r2, _ := req.GetBody()
	half := make([]byte, 5)
	io.ReadFull(r1, half)
	for i, r := range []io.Reader{r2, r1} {
		got, _ := io.ReadAll(r)
		if exp := want[5*i:]; string(got) != exp {
			t.Errorf("GetBody reader %d: %q, want %q", i, got, exp)
		}
	}
	x.body = []byte{}
	req, err = x.upstreamRequest(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	if req.Body != http.NoBody || req.ContentLength != 0 {
		t.Errorf("empty body: %T, length %d; want http.NoBody, 0", req.Body, req.ContentLength)
	}
	if rc, _ := req.GetBody(); rc != http.NoBody {
		t.Errorf("empty body: GetBody gives %T", rc)
	}
	x.body = nil
	if req, _ = x.upstreamRequest(context.Background(), b); req.Body != nil && req.Body != http.NoBody {
		t.Errorf("no body: %T", req.Body)
	}
}

// A client sending few fields, as Go's and curl's do, gets a backend
// request whose header map stays small (the fields never copied are not
// counted in its size): fewer allocations than an SDK's request (6 here,
// with the backend's base path; a hint counting them, past 8, makes a table:
// two more).
func TestUpstreamRequestFewFields(t *testing.T) {
	x, b := upstreamExchange(t)
	x.r.Header = http.Header{}
	for k, v := range map[string]string{"User-Agent": "Go-http-client/1.1", "Content-Length": "57",
		"Content-Type": "application/json", "Authorization": "Bearer sk-client", "Accept-Encoding": "gzip"} {
		x.r.Header.Set(k, v)
	}
	req, err := x.upstreamRequest(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	if len(req.Header) != 8 || req.Header.Get("User-Agent") != "Go-http-client/1.1" || req.Header.Get("Authorization") != "" {
		t.Errorf("header %v", req.Header)
	}
	if n := testing.AllocsPerRun(100, func() { x.upstreamRequest(context.Background(), b) }); n > 6 {
		t.Errorf("upstreamRequest: %v allocations, want at most 6", n)
	}
}

// The backend request's body marks the leg's sent flag itself (no
// wrapper): once written whole through WriteTo or read to EOF, and when the
// transport rewinds it (GetBody) the rewound body marks the same flag; a
// body read only in part marks nothing.
func TestReplayBodyMarksSent(t *testing.T) {
	x, b := upstreamExchange(t)
	type readerOnly struct{ io.Reader } // hides WriteTo: read to EOF
	for _, c := range []struct {
		name string
		send func(req *http.Request) error
		want bool
	}{
		{"WriteTo", func(req *http.Request) error {
			_, err := req.Body.(io.WriterTo).WriteTo(io.Discard)
			return err
		}, true},
		{"read to EOF", func(req *http.Request) error {
			_, err := io.Copy(io.Discard, readerOnly{req.Body})
			return err
		}, true},
		{"read in part", func(req *http.Request) error {
			_, err := req.Body.Read(make([]byte, 4))
			return err
		}, false},
		{"rewound, read to EOF", func(req *http.Request) error {
			io.CopyN(io.Discard, req.Body, 4)
			rc, err := req.GetBody()
			if err != nil {
				return err
			}
			_, err = io.Copy(io.Discard, readerOnly{rc})
			return err
		}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, err := x.upstreamRequest(context.Background(), b)
			if err != nil {
				t.Fatal(err)
			}
			l := &leg{}
			l.watchSent(req)
			if l.sent == nil || l.sent.Load() {
				t.Fatalf("before sending: sent %v", l.sent)
			}
			if err := c.send(req); err != nil {
				t.Fatal(err)
			}
			if got := l.sent.Load(); got != c.want {
				t.Errorf("sent %v, want %v", got, c.want)
			}
		})
	}
}

// BenchmarkUpstreamRequest builds the backend request of a chat request
// carrying an OpenAI SDK's headers.
//
//	go test -run '^$' -bench BenchmarkUpstreamRequest -benchmem ./proxy/
func BenchmarkUpstreamRequest(b *testing.B) {
	x, be := upstreamExchange(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := x.upstreamRequest(ctx, be); err != nil {
			b.Fatal(err)
		}
	}
}

// newID gives 128 random bits as 32 lowercase hex digits, in one
// allocation (the string).
func TestNewID(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := newID()
		if len(id) != 32 || strings.Trim(id, "0123456789abcdef") != "" {
			t.Fatalf("id %q: want 32 lowercase hex digits", id)
		}
		if seen[id] {
			t.Fatalf("id %q repeated", id)
		}
		seen[id] = true
	}
	if n := testing.AllocsPerRun(100, func() { newID() }); n > 1 {
		t.Errorf("newID: %v allocations, want 1", n)
	}
}
