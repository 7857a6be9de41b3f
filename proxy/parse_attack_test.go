package proxy_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"github.com/gorilla/websocket"

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
	edge       *testEdge
	ws         *websocket.Conn // the bridge's socket, dialled on first use
	frames     int             // request frames sent on ws
}

// parseProtos are the ways a body reaches the intake: HTTP/1.1, HTTP/2
// (TLS), HTTP/3 (quic-go) and a request frame of the WebSocket bridge.
var parseProtos = []string{"h1", "h2", "h3", "ws"}

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
	p.urls = map[string]string{"h1": e.http, "h2": e.https, "h3": e.h3}
	p.clients = map[string]*http.Client{"h1": h1Client(), "h2": h2Client(), "h3": h3Client(t)}
	p.edge = e
	return p
}

// send posts body on proto with the content type and returns the status
// and the error code of a refusal.
func (p *parseEdge) send(t *testing.T, proto, body, contentType string) (int, string) {
	t.Helper()
	if proto == "ws" {
		return p.sendFrame(t, body)
	}
	resp := post(t, p.clients[proto], p.urls[proto]+"/v1/chat/completions", body, "Content-Type", contentType)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if proto == "h2" && resp.ProtoMajor != 2 || proto == "h3" && resp.ProtoMajor != 3 {
		t.Fatalf("%s request served over %s", proto, resp.Proto)
	}
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	json.Unmarshal(b, &e)
	return resp.StatusCode, e.Error.Code
}

// sendFrame sends body in a request frame of the WebSocket bridge (which
// declares JSON itself) and returns the status and error code of its
// terminal frame: 200 and "" for done.
func (p *parseEdge) sendFrame(t *testing.T, body string) (int, string) {
	t.Helper()
	if p.ws == nil {
		p.ws = dialWS(t, wsURL(p.edge), keyHeader())
	}
	p.frames++
	request(t, p.ws, "r"+strconv.Itoa(p.frames), body)
	frames := readUntilTerminal(t, p.ws, 1)
	f := frames[len(frames)-1]
	switch {
	case f.Type == "done":
		return http.StatusOK, ""
	case f.Error == nil:
		t.Fatalf("error frame without an error: %+v", f)
	}
	return f.Status, f.Error.Code
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

// refusedEverywhere checks that body is refused with a 400 code on h1,
// h2, h3 and the WebSocket bridge, no backend receives it and the limiter
// is never asked.
func refusedEverywhere(t *testing.T, body, code string) {
	for _, proto := range parseProtos {
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
	for _, proto := range parseProtos {
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
// (The bridge's request frames have no content type: h1, h2 and h3 only.)
func TestAttackNonJSONContentType(t *testing.T) {
	for _, proto := range []string{"h1", "h2", "h3"} {
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

// best_of multiplies the sequences generated as n does: the intake reads
// it (exact name, once, 1..128) and reserves by the larger of the two; a
// case-folded or repeated best_of would multiply the output unseen.
func TestAttackBestOfSpellings(t *testing.T) {
	refusedEverywhere(t, `{"model":"small","BEST_OF":64,"prompt":"x"}`, "ambiguous_field")
	refusedEverywhere(t, `{"model":"small","best_of":1,"best_of":64,"prompt":"x"}`, "duplicate_field")
	refusedEverywhere(t, `{"model":"small","best_of":0}`, "invalid_value")
	refusedEverywhere(t, `{"model":"small","best_of":129}`, "invalid_value")
	refusedEverywhere(t, `{"model":"small","best_of":"4"}`, "invalid_type")
	for _, proto := range parseProtos {
		t.Run(proto, func(t *testing.T) {
			p := startParseEdge(t)
			if status, code := p.send(t, proto, `{"model":"small","n":2,"best_\u006ff":5,"max_tokens":3,"prompt":"x"}`, "application/json"); status != 200 {
				t.Fatalf("%d %s", status, code)
			}
			reqs := p.lim.all()
			if n := reqs[len(reqs)-1].N; n != 5 {
				t.Fatalf("reserved for %d sequences; want best_of's 5", n)
			}
		})
	}
}
