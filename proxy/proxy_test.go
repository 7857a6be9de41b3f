package proxy_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/routing"
)

// Events must reach the client as the backend produces them, on every
// protocol: their arrival times spread over the stream.
func TestStreamArrivesIncrementally(t *testing.T) {
	cfg := fastSim()
	cfg.StepBase = 20 * time.Millisecond
	_, simURL := startSim(t, cfg)
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	cases := []struct {
		name, base, proto string
		client            *http.Client
	}{
		{"h1", e.http, "HTTP/1.1", h1Client()},
		{"h2c", e.http, "HTTP/2.0", h2cClient()},
		{"h1-tls", e.https, "HTTP/1.1", h1Client()},
		{"h2-tls", e.https, "HTTP/2.0", h2Client()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, tc.client, tc.base+"/v1/chat/completions", chatBody(""))
			defer resp.Body.Close()
			if resp.StatusCode != 200 || resp.Proto != tc.proto {
				t.Fatalf("got %d %s; want 200 %s", resp.StatusCode, resp.Proto, tc.proto)
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
				t.Fatalf("Content-Type %q; want text/event-stream", ct)
			}
			events, done := readEvents(t, resp.Body)
			if !done || len(events) < 12 {
				t.Fatalf("got %d events, done=%v; want ≥12 and [DONE]", len(events), done)
			}
			// 12 tokens at ≥20 ms a step: a relay that buffered would
			// deliver them together; one that streams spreads them.
			span := events[len(events)-1].at.Sub(events[0].at)
			if span < 100*time.Millisecond {
				t.Fatalf("events arrived within %v; want them spread over the stream (≥100ms)", span)
			}
			gaps := 0
			for i := 1; i < len(events); i++ {
				if events[i].at.Sub(events[i-1].at) > 5*time.Millisecond {
					gaps++
				}
			}
			if gaps < len(events)/2 {
				t.Fatalf("only %d of %d events arrived separately", gaps, len(events))
			}
		})
	}
}

func TestClientCancelCancelsUpstream(t *testing.T) {
	cfg := fastSim()
	cfg.StepBase = 20 * time.Millisecond
	sim, simURL := startSim(t, cfg)
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	for _, tc := range []struct {
		name   string
		base   string
		client *http.Client
	}{{"h1", e.http, h1Client()}, {"h2", e.https, h2Client()}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp := postCtx(t, ctx, tc.client, tc.base+"/v1/chat/completions",
				`{"model":"sim-small","stream":true,"max_tokens":1000,"messages":[{"role":"user","content":"long"}]}`)
			buf := make([]byte, 64)
			if _, err := resp.Body.Read(buf); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 2*time.Second, "the sequence to run", func() bool { return sim.Stats().Running == 1 })
			cancel()
			resp.Body.Close()
			waitFor(t, 2*time.Second, "the simulator's running count to drop", func() bool { return sim.Stats().Running == 0 })
		})
	}
}

func TestRetryBeforeFirstToken(t *testing.T) {
	bad := fastSim()
	bad.FailBeforeFirst = 1
	badSim, badURL := startSim(t, bad)
	_, goodURL := startSim(t, fastSim())
	pool := poolOf(badURL, goodURL)
	pool.EjectAfter = 1000 // keep the bad backend in rotation
	e := startEdge(t, edgeOpts{pool: pool})
	// The picker compares the two backends' loads and breaks ties at
	// random, so eight requests can all go to the good one (1 in 256 when
	// every pick ties): keep sending, each a full stream, until the bad
	// backend has failed one at least, up to 64 requests.
	for i := 0; i < 64 && (i < 8 || badSim.Stats().Failed == 0); i++ {
		resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
		events, done := readEvents(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !done || len(events) < 12 {
			t.Fatalf("request %d: status %d, %d events, done=%v; want a full stream", i, resp.StatusCode, len(events), done)
		}
		for _, ev := range events {
			if ev.name == "error" {
				t.Fatalf("request %d: error event %s", i, ev.data)
			}
		}
	}
	if badSim.Stats().Failed == 0 {
		t.Fatal("the failing backend was never tried; the test proves nothing")
	}
}

func TestMidStreamDeathEndsWithErrorEvent(t *testing.T) {
	cfg := fastSim()
	cfg.DieAfterTokens = 3
	_, simURL := startSim(t, cfg)
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	for _, c := range []*http.Client{h1Client(), h2cClient()} {
		resp := post(t, c, e.http+"/v1/chat/completions", chatBody(""))
		events, done := readEvents(t, resp.Body)
		resp.Body.Close()
		if done {
			t.Fatal("got [DONE] from a stream whose backend died")
		}
		if len(events) < 2 {
			t.Fatalf("got %d events; want the tokens before the death, then an error", len(events))
		}
		last := events[len(events)-1]
		var body struct {
			Error struct{ Message, Type, Code string }
		}
		if last.name != "error" || json.Unmarshal([]byte(last.data), &body) != nil || body.Error.Type != "server_error" {
			t.Fatalf("last event %q %q; want an OpenAI-shaped error event", last.name, last.data)
		}
	}
}

func TestUsageChunkStrippedOrKept(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	hasUsage := func(extra string) bool {
		resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(extra))
		defer resp.Body.Close()
		events, done := readEvents(t, resp.Body)
		if !done {
			t.Fatal("no [DONE]")
		}
		for _, ev := range events {
			if strings.Contains(ev.data, `"usage":{`) && strings.Contains(ev.data, `"choices":[]`) {
				return true
			}
		}
		return false
	}
	if hasUsage("") {
		t.Error("usage chunk reached a client that did not ask for it")
	}
	if !hasUsage(`"stream_options":{"include_usage":true}`) {
		t.Error("usage chunk missing for a client that asked for it")
	}
	if hasUsage(`"stream_options":{"include_usage":false}`) {
		t.Error("usage chunk reached a client that said include_usage false")
	}
}

func TestErrorStatuses(t *testing.T) {
	slow := fastSim()
	slow.Model = "slow-model"
	slow.SlowStart = 2 * time.Second
	_, slowURL := startSim(t, slow)
	_, simURL := startSim(t, fastSim())
	zero := 0
	dead := routing.PoolConfig{Name: "dead", EjectAfter: 1, EjectFor: time.Minute,
		Backends: []routing.BackendConfig{{URL: closedURL(t)}}}
	slowPool := routing.PoolConfig{Name: "slow", Backends: []routing.BackendConfig{{URL: slowURL}}}
	e := startEdge(t, edgeOpts{
		pool:  poolOf(simURL),
		extra: []routing.PoolConfig{dead, slowPool},
		routes: []testRoute{
			{RouteConfig: routing.RouteConfig{Path: "/v1/", Models: []string{"sim-small"}, Pool: "p"}},
			{RouteConfig: routing.RouteConfig{Path: "/v1/", Models: []string{"dead-model"}, Pool: "dead"},
				RoutePolicy: proxy.RoutePolicy{Retries: &zero}},
			{RouteConfig: routing.RouteConfig{Path: "/v1/", Models: []string{"slow-model"}, Pool: "slow"},
				RoutePolicy: proxy.RoutePolicy{Retries: &zero, FirstTokenTimeout: 200 * time.Millisecond}},
		},
		proxy: proxy.Config{MaxBodyBytes: 4 << 10},
	})
	url := e.http + "/v1/chat/completions"
	cases := []struct {
		name   string
		url    string
		body   string
		hdr    []string
		status int
		code   string
	}{
		{"malformed json", url, `{"model":`, nil, 400, "invalid_json"},
		{"no key", url, chatBody(""), []string{"Authorization", ""}, 401, "invalid_api_key"},
		{"bad key", url, chatBody(""), []string{"Authorization", "Bearer sk-wrong"}, 401, "invalid_api_key"},
		{"unknown path", e.http + "/nope", chatBody(""), nil, 404, "unknown_url"},
		{"unknown model", url, `{"model":"gpt-9","messages":[]}`, nil, 404, "model_not_found"},
		{"body too large", url, `{"model":"sim-small","pad":"` + strings.Repeat("x", 5<<10) + `"}`, nil, 413, "request_too_large"},
		{"backend unreachable", url, `{"model":"dead-model","messages":[]}`, nil, 502, "upstream_unreachable"},
		{"no healthy backend", url, `{"model":"dead-model","messages":[]}`, nil, 503, "no_healthy_backend"},
		{"backend timeout", url, `{"model":"slow-model","stream":true,"messages":[{"role":"user","content":"x"}]}`, nil, 504, "upstream_timeout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := post(t, h1Client(), tc.url, tc.body, tc.hdr...)
			defer resp.Body.Close()
			var body struct {
				Error struct{ Message, Type, Code string }
			}
			raw, _ := io.ReadAll(resp.Body)
			if err := json.Unmarshal(raw, &body); err != nil {
				t.Fatalf("body %q is not JSON: %v", raw, err)
			}
			if resp.StatusCode != tc.status || body.Error.Code != tc.code || body.Error.Message == "" || body.Error.Type == "" {
				t.Fatalf("got %d %q; want %d with code %q", resp.StatusCode, raw, tc.status, tc.code)
			}
			if strings.Contains(string(raw), testKey) {
				t.Fatal("error body contains the API key")
			}
			if resp.Header.Get("X-Request-Id") == "" {
				t.Fatal("no X-Request-Id on an error response")
			}
		})
	}
}

// recordingBackend is a real HTTP server that records what it received and
// answers with a fixed SSE stream.
type recordingBackend struct {
	mu     sync.Mutex
	reqs   []*http.Request
	bodies []string
	body   string
	hdr    http.Header
}

func (b *recordingBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	in, _ := io.ReadAll(r.Body)
	b.mu.Lock()
	b.reqs = append(b.reqs, r.Clone(context.Background()))
	b.bodies = append(b.bodies, string(in))
	b.mu.Unlock()
	for k, vv := range b.hdr {
		w.Header()[k] = vv
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Alt-Svc", `h3=":9999"`)
	w.Header().Set("Endpoint-Load-Metrics", "TEXT named_metrics.num_requests_waiting=1")
	w.Header().Set("Connection", "X-Hop")
	w.Header().Set("X-Hop", "secret")
	io.WriteString(w, b.body)
}

func (b *recordingBackend) last() *http.Request {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.reqs[len(b.reqs)-1]
}

func TestHeadersBothWays(t *testing.T) {
	be := &recordingBackend{body: "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n"}
	srv := httptest.NewServer(be)
	defer srv.Close()
	pool := poolOf(srv.URL)
	pool.APIKey = "backend-credential"
	e := startEdge(t, edgeOpts{pool: pool})
	resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""),
		"Connection", "X-Client-Hop", "X-Client-Hop", "1", "Keep-Alive", "timeout=5",
		"X-Request-Id", "client-id-1", "X-Forwarded-For", "6.6.6.6", "Server-Timing", "fake;dur=1",
		"X-Sluice-Region", "spoofed", "X-Custom", "kept")
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	got := be.last()
	checks := []struct{ name, got, want string }{
		{"Authorization", got.Header.Get("Authorization"), "Bearer backend-credential"},
		{"X-Client-Hop", got.Header.Get("X-Client-Hop"), ""},
		{"Keep-Alive", got.Header.Get("Keep-Alive"), ""},
		{"X-Request-Id", got.Header.Get("X-Request-Id"), "client-id-1"},
		{"X-Forwarded-For", got.Header.Get("X-Forwarded-For"), "127.0.0.1"},
		{"X-Forwarded-Proto", got.Header.Get("X-Forwarded-Proto"), "http"},
		{"Server-Timing", got.Header.Get("Server-Timing"), ""},
		{"X-Sluice-Region", got.Header.Get("X-Sluice-Region"), ""},
		{"X-Custom", got.Header.Get("X-Custom"), "kept"},
		{"response Alt-Svc", resp.Header.Get("Alt-Svc"), ""},
		{"response Endpoint-Load-Metrics", resp.Header.Get("Endpoint-Load-Metrics"), ""},
		{"response X-Hop", resp.Header.Get("X-Hop"), ""},
		{"response X-Request-Id", resp.Header.Get("X-Request-Id"), "client-id-1"},
		{"response X-Sluice-Region", resp.Header.Get("X-Sluice-Region"), "test-region"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %q; want %q", c.name, c.got, c.want)
		}
	}
	be.mu.Lock()
	sent := be.bodies[len(be.bodies)-1]
	be.mu.Unlock()
	if !strings.Contains(sent, `"stream_options":{"include_usage":true}`) || !strings.Contains(sent, `"hello there"`) {
		t.Errorf("backend got body %q; want the client's body asking for usage", sent)
	}
	// A generated id when the client sends none.
	resp = post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
	resp.Body.Close()
	if id := be.last().Header.Get("X-Request-Id"); len(id) != 32 || resp.Header.Get("X-Request-Id") != id {
		t.Errorf("generated request id %q (response %q); want the same 32 hex digits both ways", id, resp.Header.Get("X-Request-Id"))
	}
}

func TestGenericSSERoute(t *testing.T) {
	stream := ": hello\n\nid: 7\nevent: tick\nretry: 1500\ndata: one\ndata: two\n\nid: 8\ndata: three\n\n"
	be := &recordingBackend{body: stream}
	srv := httptest.NewServer(be)
	defer srv.Close()
	e := startEdge(t, edgeOpts{
		pool: poolOf(srv.URL),
		routes: []testRoute{{RouteConfig: routing.RouteConfig{Path: "/events/", Pool: "p"},
			RoutePolicy: proxy.RoutePolicy{Kind: proxy.KindSSE, AllowQueryKey: true}}},
	})
	req, _ := http.NewRequest(http.MethodGet, e.http+"/events/feed?topic=a&api_key="+testKey, nil)
	req.Header.Set("Last-Event-ID", "6")
	resp, err := h1Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != stream {
		t.Fatalf("got %d %q; want 200 and the stream untouched %q", resp.StatusCode, body, stream)
	}
	got := be.last()
	if got.Header.Get("Last-Event-Id") != "6" {
		t.Errorf("Last-Event-ID not forwarded: %v", got.Header)
	}
	if got.URL.RawQuery != "topic=a" {
		t.Errorf("backend saw query %q; want the key removed", got.URL.RawQuery)
	}
	// The query key is refused where the route does not allow it.
	e2 := startEdge(t, edgeOpts{pool: poolOf(srv.URL)})
	resp = post(t, h1Client(), e2.http+"/v1/chat/completions?api_key="+testKey, chatBody(""), "Authorization", "")
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("query key on a route without allow_query_key: got %d; want 401", resp.StatusCode)
	}
}

func TestModelsAndNonStreamed(t *testing.T) {
	sim, simURL := startSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(simURL), routes: []testRoute{{RouteConfig: routing.RouteConfig{Pool: "p", Models: []string{"sim-small"}}}}})
	req, _ := http.NewRequest(http.MethodGet, e.http+"/v1/models", nil)
	req.Header.Set("x-api-key", testKey)
	resp, err := h1Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(raw), `"id":"sim-small"`) {
		t.Fatalf("models: got %d %s", resp.StatusCode, raw)
	}
	for _, path := range []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings"} {
		body := `{"model":"sim-small","max_tokens":5,"messages":[{"role":"user","content":"hi"}],"prompt":"hi","input":"hi"}`
		resp := post(t, h1Client(), e.http+path, body)
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var out struct {
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(raw, &out) != nil || out.Usage.PromptTokens == 0 {
			t.Fatalf("%s: got %d %s", path, resp.StatusCode, raw)
		}
	}
	// The simulator counts a request after its body is written: the
	// client may have read it first.
	waitFor(t, 2*time.Second, "the simulator to count 3 completed requests", func() bool {
		return sim.Stats().Completed >= 3
	})
}
