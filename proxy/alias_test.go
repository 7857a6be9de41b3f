package proxy_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/routing"
)

// servedName is the name the simulator serves (and, like vLLM, the only
// one it accepts); tenants ask for the alias publicName.
const (
	servedName = "meta-llama/Llama-3.1-8B-Instruct"
	publicName = "gpt-small"
)

// startAliasEdge runs a simulator serving servedName behind a route that
// lists publicName with served_models {publicName: servedName}, plus
// extraModels as public names, and records the limiter's admissions.
func startAliasEdge(t *testing.T, extraModels ...string) (*testEdge, *admitLog) {
	t.Helper()
	cfg := fastSim()
	cfg.Model = servedName
	_, simURL := startSim(t, cfg)
	lim := &admitLog{Service: limiter.NewLocal(1)}
	e := startEdge(t, edgeOpts{pool: poolOf(simURL), limiter: lim, limits: limiter.Limits{TokensPerMinute: 1 << 40},
		routes: []testRoute{{RouteConfig: routing.RouteConfig{Pool: "p",
			Models:       append([]string{publicName}, extraModels...),
			ServedModels: map[string]string{publicName: servedName}}}}})
	return e, lim
}

// aliasCase is one request of each dialect, streamed or not; last is the
// stream's last event (its data's "type", or [DONE]).
type aliasCase struct{ name, path, body, last string }

var aliasCases = []aliasCase{
	{"chat stream", "/v1/chat/completions", `{"model":"gpt-small","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, "[DONE]"},
	{"chat", "/v1/chat/completions", `{"model":"gpt-small","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, ""},
	{"chat escaped model", "/v1/chat/completions", `{"model":"gpt\u002dsmall","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, "[DONE]"},
	{"completions stream", "/v1/completions", `{"stream":true,"max_tokens":5,"prompt":"hi","model":"gpt-small"}`, "[DONE]"},
	{"completions", "/v1/completions", `{"max_tokens":5,"prompt":"hi","model" : "gpt-small"}`, ""},
	{"responses stream", "/v1/responses", `{"model":"gpt-small","stream":true,"max_output_tokens":5,"input":"hi"}`, "response.incomplete"},
	{"responses", "/v1/responses", `{"model":"gpt-small","max_output_tokens":5,"input":"hi"}`, ""},
	{"messages stream", "/v1/messages", `{"model":"gpt-small","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, "message_stop"},
	{"messages", "/v1/messages", `{"model":"gpt-small","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, ""},
	{"embeddings", "/v1/embeddings", `{"model":"gpt-small","input":"hi"}`, ""},
}

// modelsIn collects the values of every "model" member in v, at any depth.
func modelsIn(v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && k == "model" {
				out = append(out, s)
			} else {
				out = append(out, modelsIn(x)...)
			}
		}
	case []any:
		for _, x := range v {
			out = append(out, modelsIn(x)...)
		}
	}
	return out
}

// checkPublic fails unless every model member in docs is publicName, there
// is at least one, and the served name appears nowhere.
func checkPublic(t *testing.T, what string, raw string, docs []any) {
	t.Helper()
	if strings.Contains(raw, servedName) {
		t.Fatalf("%s: the served name reached the client: %s", what, raw)
	}
	n := 0
	for _, d := range docs {
		for _, m := range modelsIn(d) {
			if m != publicName {
				t.Fatalf("%s: model %q; want %q in %s", what, m, publicName, raw)
			}
			n++
		}
	}
	if n == 0 {
		t.Fatalf("%s: no model member in %s", what, raw)
	}
}

// A tenant asks for the alias over h1, h2 and h3: the simulator, which
// serves only the served name, answers (so the body was rewritten), every
// stream event and non-streamed body names the public model, the stream
// ends with its API's last event, and the limiter and the access log saw
// the public name.
func TestAliasRewrittenAndRestoredHTTP(t *testing.T) {
	e, lim := startAliasEdge(t)
	clients := map[string]struct {
		c   *http.Client
		url string
	}{"h1": {h1Client(), e.http}, "h2": {h2Client(), e.https}, "h3": {h3Client(t), e.h3}}
	for _, proto := range []string{"h1", "h2", "h3"} {
		for _, c := range aliasCases {
			t.Run(proto+"/"+c.name, func(t *testing.T) {
				cl := clients[proto]
				resp := post(t, cl.c, cl.url+c.path, c.body)
				raw, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("%d %s", resp.StatusCode, raw)
				}
				var docs []any
				if c.last == "" {
					var v any
					if err := json.Unmarshal(raw, &v); err != nil {
						t.Fatalf("body %s: %v", raw, err)
					}
					docs = append(docs, v)
					if cl := resp.Header.Get("Content-Length"); cl != "" && cl != itoa(len(raw)) {
						t.Fatalf("Content-Length %s for %d bytes", cl, len(raw))
					}
				} else {
					events, done := readEvents(t, strings.NewReader(string(raw)))
					last := ""
					for _, ev := range events {
						var v map[string]any
						if err := json.Unmarshal([]byte(ev.data), &v); err != nil {
							t.Fatalf("event %q: %v", ev.data, err)
						}
						docs = append(docs, v)
						last, _ = v["type"].(string)
					}
					if done {
						last = "[DONE]"
					}
					if last != c.last {
						t.Fatalf("stream ended with %q; want %q: %s", last, c.last, raw)
					}
				}
				checkPublic(t, c.name, string(raw), docs)
				reqs := lim.all()
				if m := reqs[len(reqs)-1].Model; m != publicName {
					t.Fatalf("limiter admitted model %q; want %q", m, publicName)
				}
			})
		}
	}
	waitFor(t, 2*time.Second, "access log lines naming the public model", func() bool {
		return len(e.log.lines(`"model":"gpt-small"`, `"status":200`)) == 3*len(aliasCases)
	})
	if lines := e.log.lines(servedName); len(lines) != 0 {
		t.Fatalf("access log names the served model: %q", lines)
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// The same requests over the WebSocket bridge: every frame names the
// public model, never the served one.
func TestAliasRestoredWebSocketBridge(t *testing.T) {
	e, _ := startAliasEdge(t)
	c := dialWS(t, wsURL(e), keyHeader())
	for _, r := range aliasCases {
		sendJSON(t, c, map[string]any{"type": "request", "id": r.name, "path": r.path, "body": json.RawMessage(r.body)})
		var docs []any
		var raw strings.Builder
		for {
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			mt, msg, err := c.ReadMessage()
			if err != nil || mt != websocket.TextMessage {
				t.Fatalf("%s: read %d %v", r.name, mt, err)
			}
			raw.Write(msg)
			raw.WriteByte('\n')
			var f map[string]any
			if err := json.Unmarshal(msg, &f); err != nil {
				t.Fatalf("%s: frame %s: %v", r.name, msg, err)
			}
			docs = append(docs, f)
			if f["type"] == "error" {
				t.Fatalf("%s: error frame %s", r.name, msg)
			}
			if f["type"] == "done" {
				break
			}
		}
		checkPublic(t, r.name, raw.String(), docs)
	}
}

// The backend gets the served name in place of the public one, the rest
// of the body byte for byte, whatever the dialect and however the client
// escaped the name.
func TestAliasForwardedBodyRewrittenInPlace(t *testing.T) {
	rb := &recordingBackend{body: "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"model\":\"" + servedName + "\"}\n\ndata: [DONE]\n\n"}
	srv := httptest.NewServer(rb)
	t.Cleanup(srv.Close)
	e := startEdge(t, edgeOpts{pool: poolOf(srv.URL),
		routes: []testRoute{{RouteConfig: routing.RouteConfig{Pool: "p", Models: []string{publicName},
			ServedModels: map[string]string{publicName: servedName}}}}})
	for _, c := range []struct{ path, in, want string }{
		{"/v1/chat/completions", `{"stream":true, "model" :"gpt\u002dsmall","stream_options":{"include_usage":true},"messages":[]}`,
			`{"stream":true, "model" :"meta-llama/Llama-3.1-8B-Instruct","stream_options":{"include_usage":true},"messages":[]}`},
		// The edge adds stream_options before the model: the span moves.
		{"/v1/chat/completions", `{"stream":true,"model":"gpt-small","messages":[]}`,
			`{"stream_options":{"include_usage":true},"stream":true,"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[]}`},
		{"/v1/completions", `{"prompt":"x","model":"gpt-small"}`, `{"prompt":"x","model":"meta-llama/Llama-3.1-8B-Instruct"}`},
		{"/v1/responses", `{"input":"gpt-small","model":"gpt-small"}`, `{"input":"gpt-small","model":"meta-llama/Llama-3.1-8B-Instruct"}`},
		{"/v1/messages", `{"model":"\u0067pt-small","system":"\"gpt-small\""}`, `{"model":"meta-llama/Llama-3.1-8B-Instruct","system":"\"gpt-small\""}`},
	} {
		resp := post(t, h1Client(), e.http+c.path, c.in)
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", c.in, resp.StatusCode, raw)
		}
		rb.mu.Lock()
		got := rb.bodies[len(rb.bodies)-1]
		rb.mu.Unlock()
		if got != c.want {
			t.Fatalf("%s: backend got %s; want %s", c.in, got, c.want)
		}
		if strings.Contains(string(raw), servedName) || !strings.Contains(string(raw), `"model":"gpt-small"`) {
			t.Fatalf("%s: client got %s", c.in, raw)
		}
	}
}

// /v1/models lists public names: the alias, not the name it is served
// under, unless a route lists that name as public too; a request for a
// served name that is not public is not routed.
func TestAliasModelsListsPublicNames(t *testing.T) {
	list := func(e *testEdge) []string {
		req, _ := http.NewRequest(http.MethodGet, e.http+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer "+testKey)
		resp, err := h1Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var l struct {
			Object string
			Data   []struct{ ID, Object string }
		}
		if err := json.NewDecoder(resp.Body).Decode(&l); err != nil || resp.StatusCode != 200 || l.Object != "list" {
			t.Fatalf("/v1/models: %d %+v %v", resp.StatusCode, l, err)
		}
		var ids []string
		for _, m := range l.Data {
			if m.Object != "model" {
				t.Fatalf("entry %+v", m)
			}
			ids = append(ids, m.ID)
		}
		return ids
	}
	e, _ := startAliasEdge(t)
	if ids := list(e); strings.Join(ids, ",") != publicName {
		t.Fatalf("models %q; want only %q", ids, publicName)
	}
	resp := post(t, h1Client(), e.http+"/v1/chat/completions", `{"model":"`+servedName+`","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	if eb := readAPIError(t, resp); resp.StatusCode != 404 || code(eb) != "model_not_found" {
		t.Fatalf("served name asked directly: %d %q; want 404 model_not_found", resp.StatusCode, code(eb))
	}
	both, _ := startAliasEdge(t, servedName)
	if ids := list(both); strings.Join(ids, ",") != publicName+","+servedName {
		t.Fatalf("models %q; want %q and %q", ids, publicName, servedName)
	}
	resp = post(t, h1Client(), both.http+"/v1/chat/completions", `{"model":"`+servedName+`","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(raw), `"model":"`+servedName+`"`) {
		t.Fatalf("served name listed as public: %d %s", resp.StatusCode, raw)
	}
}

// A non-streamed answer longer than the edge's head window is streamed
// through; the served name is restored in it wherever it falls, also at
// the end of the body and split across the backend's writes, and the
// length is the restored body's (no stale Content-Length of the backend).
func TestAliasRestoredInLongNonStreamedBody(t *testing.T) {
	filler := strings.Repeat("a", 100<<10)
	body := `{"id":"c1","object":"chat.completion","model":"` + servedName + `","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		filler + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":7},"model":"` + servedName + `"}`
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		rc := http.NewResponseController(w)
		// Cut the last model value in two writes.
		cut := len(body) - len(servedName)/2 - 2
		io.WriteString(w, body[:cut])
		rc.Flush()
		time.Sleep(5 * time.Millisecond)
		io.WriteString(w, body[cut:])
	}))
	defer backend.Close()
	e := startEdge(t, edgeOpts{pool: poolOf(backend.URL),
		routes: []testRoute{{RouteConfig: routing.RouteConfig{Pool: "p", Models: []string{publicName},
			ServedModels: map[string]string{publicName: servedName}}}}})
	for _, pc := range []string{"h1", "h2"} {
		t.Run(pc, func(t *testing.T) {
			client, url := h1Client(), e.http
			if pc == "h2" {
				client, url = h2Client(), e.https
			}
			resp := post(t, client, url+"/v1/chat/completions", `{"model":"gpt-small","messages":[{"role":"user","content":"hi"}]}`)
			raw, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || err != nil {
				t.Fatalf("status %d, %v", resp.StatusCode, err)
			}
			want := strings.ReplaceAll(body, servedName, publicName)
			if string(raw) != want {
				t.Fatalf("got %d bytes (served name present: %v); want the %d-byte restored body",
					len(raw), strings.Contains(string(raw), servedName), len(want))
			}
			if resp.ContentLength != -1 && resp.ContentLength != int64(len(want)) {
				t.Fatalf("Content-Length %d; body %d", resp.ContentLength, len(want))
			}
		})
	}
}
