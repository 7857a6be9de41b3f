package proxy_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/routing"
)

// admitLog is the real local limiter, recording what each request asked
// to reserve (the tenant's charge before usage settles it).
type admitLog struct {
	limiter.Service
	mu   sync.Mutex
	reqs []limiter.Request
}

func (a *admitLog) Admit(ctx context.Context, r limiter.Request) (limiter.Decision, error) {
	a.mu.Lock()
	a.reqs = append(a.reqs, r)
	a.mu.Unlock()
	return a.Service.Admit(ctx, r)
}

func (a *admitLog) all() []limiter.Request {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]limiter.Request(nil), a.reqs...)
}

// parseEdge is an edge with two pools, "big" and "small", each routed by
// its model name, backed by recording backends, and an admitLog limiter.
type parseEdge struct {
	big, small *recordingBackend
	lim        *admitLog
	urls       map[string]string // protocol -> base URL
	clients    map[string]*http.Client
}

func startParseEdge(t *testing.T) *parseEdge {
	const sse = "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n"
	p := &parseEdge{big: &recordingBackend{body: sse}, small: &recordingBackend{body: sse},
		lim: &admitLog{Service: limiter.NewLocal(1)}}
	bs, ss := httptest.NewServer(p.big), httptest.NewServer(p.small)
	t.Cleanup(bs.Close)
	t.Cleanup(ss.Close)
	big, small := poolOf(bs.URL), poolOf(ss.URL)
	big.Name, small.Name = "big", "small"
	e := startEdge(t, edgeOpts{pool: big, extra: []routing.PoolConfig{small}, limiter: p.lim,
		limits: limiter.Limits{TokensPerMinute: 1 << 40},
		routes: []testRoute{
			{RouteConfig: routing.RouteConfig{Name: "big", Models: []string{"big"}, Pool: "big"}},
			{RouteConfig: routing.RouteConfig{Name: "small", Models: []string{"small"}, Pool: "small"}},
		}})
	p.urls = map[string]string{"h1": e.http, "h2": e.https}
	p.clients = map[string]*http.Client{"h1": h1Client(), "h2": h2Client()}
	return p
}

// send posts body on proto with the content type and returns the status
// and the error code of a refusal.
func (p *parseEdge) send(t *testing.T, proto, body, contentType string) (int, string) {
	t.Helper()
	resp := post(t, p.clients[proto], p.urls[proto]+"/v1/chat/completions", body, "Content-Type", contentType)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if proto == "h2" && resp.ProtoMajor != 2 {
		t.Fatalf("h2 request served over %s", resp.Proto)
	}
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	json.Unmarshal(b, &e)
	return resp.StatusCode, e.Error.Code
}

func (p *parseEdge) received() (big, small []string) {
	p.big.mu.Lock()
	big = append(big, p.big.bodies...)
	p.big.mu.Unlock()
	p.small.mu.Lock()
	small = append(small, p.small.bodies...)
	p.small.mu.Unlock()
	return big, small
}

// refusedEverywhere checks that body is refused with a 400 code on h1 and
// h2, no backend receives it and the limiter is never asked.
func refusedEverywhere(t *testing.T, body, code string) {
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			p := startParseEdge(t)
			status, got := p.send(t, proto, body, "application/json")
			big, small := p.received()
			if status != http.StatusBadRequest || got != code {
				t.Fatalf("got %d %q; want 400 %q", status, got, code)
			}
			if len(big)+len(small) != 0 || len(p.lim.all()) != 0 {
				t.Fatalf("forwarded %q %q, admitted %v", big, small, p.lim.all())
			}
		})
	}
}

// A tenant routes and is limited as "small" while the backend, which
// matches names exactly (pydantic), serves "big".
func TestAttackModelCaseDuplicate(t *testing.T) {
	refusedEverywhere(t, `{"model":"big","Model":"small","messages":[{"role":"user","content":"hi"}]}`, "duplicate_field")
	refusedEverywhere(t, `{"Model":"small","model":"big","messages":[]}`, "ambiguous_field")
	refusedEverywhere(t, `{"model":"big","model":"small"}`, "duplicate_field")
}

// "MAX_TOKENS":1 would reserve 1 token while the backend, which ignores
// the name, generates up to its own default.
func TestAttackMaxTokensUpperCase(t *testing.T) {
	refusedEverywhere(t, `{"model":"small","MAX_TOKENS":1,"messages":[]}`, "ambiguous_field")
	refusedEverywhere(t, `{"model":"small","max_to\u212aens":1,"messages":[]}`, "ambiguous_field")
	refusedEverywhere(t, `{"model":"small","max_tokens":20000,"max_tokens":1}`, "duplicate_field")
}

// "STREAM":true is no stream for the backend; "n" in another case would
// multiply the output unseen.
func TestAttackStreamUpperCase(t *testing.T) {
	refusedEverywhere(t, `{"model":"small","STREAM":true}`, "ambiguous_field")
	refusedEverywhere(t, `{"model":"small","N":64}`, "ambiguous_field")
}

// A case-duplicated stream_options made the edge believe the client asked
// for usage (so it did not ask) while the backend read include_usage false.
func TestAttackStreamOptionsCaseDuplicate(t *testing.T) {
	refusedEverywhere(t, `{"model":"small","stream":true,"stream_options":{"include_usage":false},"STREAM_OPTIONS":{"include_usage":true}}`, "duplicate_field")
	refusedEverywhere(t, `{"model":"small","stream":true,"stream_options":{"include_usage":false,"Include_Usage":true}}`, "duplicate_field")
	refusedEverywhere(t, `{"model":"small","stream":true,"stream_options":{"include_usage":false},"stream_options":{"include_usage":true}}`, "duplicate_field")
}

// When the edge asks for usage it edits the client's own stream_options:
// the backend gets one stream_options with include_usage true, and the
// client's other bytes.
func TestAttackStreamOptionsNullNotDuplicated(t *testing.T) {
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			p := startParseEdge(t)
			for _, c := range []struct{ in, want string }{
				{`{"model":"small","stream":true,"stream_options":null}`, `{"model":"small","stream":true,"stream_options":{"include_usage":true}}`},
				{`{"model":"small","stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true}}`,
					`{"model":"small","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`},
			} {
				if status, code := p.send(t, proto, c.in, "application/json"); status != 200 {
					t.Fatalf("%s: %d %s", c.in, status, code)
				}
				_, small := p.received()
				if got := small[len(small)-1]; got != c.want {
					t.Fatalf("backend got %s; want %s", got, c.want)
				}
			}
		})
	}
}

// A body sent as a form or another JSON type is read as JSON all the same:
// routed by its model, charged its tokens, and forwarded as
// application/json; a body that is not JSON is refused.
func TestAttackNonJSONContentType(t *testing.T) {
	for _, proto := range []string{"h1", "h2"} {
		t.Run(proto, func(t *testing.T) {
			p := startParseEdge(t)
			body := `{"model":"small","max_tokens":777,"n":2,"messages":[{"role":"user","content":"hello"}]}`
			for i, ct := range []string{"application/x-www-form-urlencoded", "application/vnd.api+json", "text/html", ""} {
				if status, code := p.send(t, proto, body, ct); status != 200 {
					t.Fatalf("%q: %d %s", ct, status, code)
				}
				big, small := p.received()
				if len(big) != 0 || len(small) != i+1 {
					t.Fatalf("%q: routed to big %d, small %d", ct, len(big), len(small))
				}
				if got := p.small.last().Header.Get("Content-Type"); got != "application/json" {
					t.Fatalf("%q: forwarded as %q", ct, got)
				}
				reqs := p.lim.all()
				if r := reqs[len(reqs)-1]; r.Model != "small" || r.OutputTokens != 777 || r.InputTokens == 0 {
					t.Fatalf("%q: admitted %+v", ct, r)
				}
			}
			if status, code := p.send(t, proto, "model=small&max_tokens=1", "application/x-www-form-urlencoded"); status != 400 || code != "invalid_json" {
				t.Fatalf("form body: %d %q", status, code)
			}
			if n := len(p.lim.all()); n != 4 {
				t.Fatalf("%d admissions; want 4", n)
			}
		})
	}
}

// n outside 1..128 is refused; inside, it is parsed (H7 reserves by it).
func TestParseNRange(t *testing.T) {
	refusedEverywhere(t, `{"model":"small","n":0}`, "invalid_value")
	refusedEverywhere(t, `{"model":"small","n":129}`, "invalid_value")
	refusedEverywhere(t, `{"model":"small","n":"2"}`, "invalid_type")
}
