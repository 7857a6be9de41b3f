package proxy_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/limiter"
)

// dialectFixtures are backend streams, one per model name, as the engines
// send them:
//   - chat: vLLM v0.11 protocol.py ChatCompletionStreamResponse (tool_calls
//     with function.arguments deltas, reasoning_content from the reasoning
//     parser, "reasoning" as newer vLLM and OpenRouter name it; one choice
//     per chunk when n > 1), written with spaces after ':' as Python's
//     json.dumps does by default (TGI, SGLang's some paths, proxies);
//   - completions: the legacy text_completion chunk;
//   - responses: vLLM v0.11 serving_responses.py / openai-python v1.109
//     response_stream_event.py: "event: <type>" lines, usage in
//     response.completed as input_tokens/output_tokens, no [DONE];
//   - messages: anthropic-sdk-typescript v0.65 MessageStreamEvent and vLLM
//     v0.11 entrypoints/anthropic: message_start usage.input_tokens,
//     content_block_delta text/thinking/input_json deltas,
//     message_delta usage.output_tokens, message_stop, no [DONE].
var dialectFixtures = map[string]string{
	// 2 content + 3 reasoning_content + 1 reasoning + 3 arguments = 9 tokens.
	"chat-tools": sse("",
		`{"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}`,
		`{"id": "c1", "choices": [{"index": 0, "delta": {"reasoning_content": "Let"}}]}`,
		`{"id": "c1", "choices": [{"index": 0, "delta": {"reasoning_content": " me"}}]}`,
		`{"id": "c1", "choices": [{"index": 0, "delta": {"reasoning_content": " think"}}]}`,
		`{"id": "c1", "choices": [{"index": 0, "delta": {"reasoning": "."}}]}`,
		`{"id": "c1", "choices": [{"index": 0, "delta": {"content": "Sure"}}]}`,
		`{"id": "c1", "choices": [{"index": 0, "delta": {"content" : "!"}}]}`,
		`{"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}}]}`,
		`{"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": "}}]}}]}`,
		`{"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris"}}]}}]}`,
		`{"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\"}"}}]}}]}`,
		`{"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}`,
		`[DONE]`),
	// n=2, 3 steps: one choice per chunk, 6 tokens.
	"chat-n2": sse("",
		`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		`{"choices":[{"index":1,"delta":{"role":"assistant","content":""}}]}`,
		`{"choices":[{"index":0,"delta":{"content":"a"}}]}`,
		`{"choices":[{"index":1,"delta":{"content":"b"}}]}`,
		`{"choices":[{"index":0,"delta":{"content":"c"}}]}`,
		`{"choices":[{"index":1,"delta":{"content":"d"}}]}`,
		`{"choices":[{"index":0,"delta":{"content":"e"}}]}`,
		`{"choices":[{"index":1,"delta":{"content":"f"}}]}`,
		`[DONE]`),
	// legacy completions, 4 tokens.
	"completions": sse("",
		`{"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": " Once", "logprobs": null, "finish_reason": null}]}`,
		`{"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": " upon", "logprobs": null, "finish_reason": null}]}`,
		`{"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": " a", "logprobs": null, "finish_reason": null}]}`,
		`{"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": " time", "logprobs": null, "finish_reason": "length"}]}`,
		`[DONE]`),
	// 3 text + 2 reasoning + 2 arguments deltas; usage says 40 out, 17 in.
	"responses": responsesStream(true),
	// the same without usage: the 7 counted deltas settle.
	"responses-nousage": responsesStream(false),
	// 3 text + 2 thinking + 2 input_json deltas; usage says 30 out, 25 in.
	"messages": messagesStream(),
	// Anthropic's prompt caching: input_tokens leaves out the cached
	// prompt, written (cache_creation_input_tokens) or read
	// (cache_read_input_tokens); the whole prompt is 25 + 10 + 100. The
	// message_delta usage is cumulative and, in the current API
	// (anthropic-sdk-typescript MessageDeltaUsage), repeats the input counts.
	"messages-cache": strings.Replace(strings.Replace(messagesStream(),
		`"usage":{"input_tokens":25,"output_tokens":1}`,
		`"usage":{"input_tokens":25,"cache_creation_input_tokens":10,"cache_read_input_tokens":100,"output_tokens":1}`, 1),
		`"usage":{"output_tokens":30}`,
		`"usage":{"input_tokens":25,"cache_creation_input_tokens":10,"cache_read_input_tokens":100,"output_tokens":30}`, 1),
}

func responsesStream(usage bool) string {
	u := `null`
	if usage {
		u = `{"input_tokens":17,"input_tokens_details":{"cached_tokens":0},"output_tokens":40,"output_tokens_details":{"reasoning_tokens":2},"total_tokens":57}`
	}
	return sse("response.",
		`created {"response":{"id":"resp_1","object":"response","status":"in_progress","output":[],"usage":null},"sequence_number":0,"type":"response.created"}`,
		`in_progress {"response":{"id":"resp_1","status":"in_progress","usage":null},"sequence_number":1,"type":"response.in_progress"}`,
		`reasoning_text.delta {"content_index":0,"delta":"Hmm","item_id":"rs_1","output_index":0,"sequence_number":2,"type":"response.reasoning_text.delta"}`,
		`reasoning_text.delta {"content_index":0,"delta":" ok","item_id":"rs_1","output_index":0,"sequence_number":3,"type":"response.reasoning_text.delta"}`,
		`output_item.added {"item":{"id":"msg_1","type":"message","role":"assistant","content":[]},"output_index":1,"sequence_number":4,"type":"response.output_item.added"}`,
		`output_text.delta {"content_index":0,"delta":"Hello","item_id":"msg_1","logprobs":[],"output_index":1,"sequence_number":5,"type":"response.output_text.delta"}`,
		`output_text.delta {"content_index":0,"delta":" there","item_id":"msg_1","logprobs":[],"output_index":1,"sequence_number":6,"type":"response.output_text.delta"}`,
		`output_text.delta {"content_index":0,"delta":"!","item_id":"msg_1","logprobs":[],"output_index":1,"sequence_number":7,"type":"response.output_text.delta"}`,
		`output_text.done {"content_index":0,"text":"Hello there!","item_id":"msg_1","output_index":1,"sequence_number":8,"type":"response.output_text.done"}`,
		`function_call_arguments.delta {"delta":"{\"a\":","item_id":"fc_1","output_index":2,"sequence_number":9,"type":"response.function_call_arguments.delta"}`,
		`function_call_arguments.delta {"delta":"1}","item_id":"fc_1","output_index":2,"sequence_number":10,"type":"response.function_call_arguments.delta"}`,
		`completed {"response":{"id":"resp_1","object":"response","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"Hello there!"}]}],"usage":`+u+`},"sequence_number":11,"type":"response.completed"}`)
}

func messagesStream() string {
	return sse("",
		`message_start {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"usage":{"input_tokens":25,"output_tokens":1}}}`,
		`content_block_start {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}`,
		`ping {"type": "ping"}`,
		`content_block_delta {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let me"}}`,
		`content_block_delta {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":" see"}}`,
		`content_block_delta {"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQB"}}`,
		`content_block_stop {"type":"content_block_stop","index":0}`,
		`content_block_start {"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`,
		`content_block_delta {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi"}}`,
		`content_block_delta {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":" you"}}`,
		`content_block_delta {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"!"}}`,
		`content_block_stop {"type":"content_block_stop","index":1}`,
		`content_block_start {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_1","name":"f","input":{}}}`,
		`content_block_delta {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"a\":"}}`,
		`content_block_delta {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"1}"}}`,
		`content_block_stop {"type":"content_block_stop","index":2}`,
		`message_delta {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":30}}`,
		`message_stop {"type":"message_stop"}`)
}

// sse writes events: a payload "name {json}" gets an "event: prefix+name"
// line, a bare one only data.
func sse(prefix string, payloads ...string) string {
	var b strings.Builder
	for _, p := range payloads {
		if i := strings.IndexByte(p, ' '); i > 0 && p[0] != '{' && p[0] != '[' {
			b.WriteString("event: " + prefix + p[:i] + "\n")
			p = p[i+1:]
		}
		b.WriteString("data: " + p + "\n\n")
	}
	return b.String()
}

// dialectBackend streams the fixture its request's model names; with
// "-cut" appended, it stops after the fixture's first half.
func dialectBackend(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Model string `json:"model"`
		}
		json.NewDecoder(r.Body).Decode(&body)
		name, cut := strings.CutSuffix(body.Model, "-cut")
		stream, ok := dialectFixtures[name]
		if !ok {
			http.Error(w, `{"error":{"message":"no fixture"}}`, 404)
			return
		}
		if cut {
			evs := strings.SplitAfter(stream, "\n\n")
			stream = strings.Join(evs[:len(evs)/2], "")
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range strings.SplitAfter(stream, "\n\n") {
			io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestDialectTokensSettle streams each API's shapes through every listener
// and checks what the limiter settled: the backend's usage when it sent
// one, else one token per delta event (text, arguments, reasoning), and
// that each stream ends at its API's last event without an error event.
func TestDialectTokensSettle(t *testing.T) {
	backend := dialectBackend(t)
	cases := []struct {
		model, path string
		in, out     int64 // settled; in < 0: the edge's estimate
		last        string
	}{
		{"chat-tools", "/v1/chat/completions", -1, 9, "[DONE]"},
		{"chat-n2", "/v1/chat/completions", -1, 6, "[DONE]"},
		{"completions", "/v1/completions", -1, 4, "[DONE]"},
		{"responses", "/v1/responses", 17, 40, "response.completed"},
		{"responses-nousage", "/v1/responses", -1, 7, "response.completed"},
		{"messages", "/v1/messages", 25, 30, "message_stop"},
		{"messages-cache", "/v1/messages", 135, 30, "message_stop"},
	}
	for _, pc := range []struct{ name, base string }{{"h1", "http"}, {"h2c", "h2c"}, {"h2", "https"}, {"h3", "h3"}} {
		t.Run(pc.name, func(t *testing.T) {
			for _, c := range cases {
				t.Run(c.model, func(t *testing.T) {
					lim := &settleRecorder{Local: limiter.NewLocal(1), settled: make(chan limiter.Usage, 1)}
					limits := limiter.Limits{TokensPerMinute: 100000}
					e := startEdge(t, edgeOpts{pool: poolOf(backend), limiter: lim, limits: limits})
					client, base := h1Client(), e.http
					switch pc.base {
					case "h2c":
						client = h2cClient()
					case "https":
						client, base = h2Client(), e.https
					case "h3":
						client, base = h3Client(t), e.h3
					}
					body := `{"model":"` + c.model + `","stream":true,"messages":[{"role":"user","content":"hello"}],"input":"hello"}`
					resp := post(t, client, base+c.path, body)
					defer resp.Body.Close()
					if resp.StatusCode != 200 {
						raw, _ := io.ReadAll(resp.Body)
						t.Fatalf("status %d: %s", resp.StatusCode, raw)
					}
					last := lastEvent(t, resp.Body)
					if last != c.last {
						t.Fatalf("last event %q; want %q (the stream must end at its API's last event)", last, c.last)
					}
					var got limiter.Usage
					select {
					case got = <-lim.settled:
					case <-time.After(3 * time.Second):
						t.Fatal("nothing settled")
					}
					if got.OutputTokens != c.out {
						t.Fatalf("settled output %d; want %d", got.OutputTokens, c.out)
					}
					if c.in >= 0 && got.InputTokens != c.in {
						t.Fatalf("settled input %d; want the backend's %d", got.InputTokens, c.in)
					}
				})
			}
		})
	}
}

// settleRecorder is the local limiter, telling what each request settled.
type settleRecorder struct {
	*limiter.Local
	settled chan limiter.Usage
}

func (r *settleRecorder) Settle(ctx context.Context, tk *limiter.Ticket, u limiter.Usage) error {
	err := r.Local.Settle(ctx, tk, u)
	r.settled <- u
	return err
}

// lastEvent reads a stream whole and names its last event: [DONE], or the
// event: line (else data type) of the last one. An error event fails.
func lastEvent(t *testing.T, body io.Reader) string {
	t.Helper()
	events, done := readEvents(t, body)
	for _, ev := range events {
		if ev.name == "error" {
			t.Fatalf("error event %s", ev.data)
		}
	}
	if done {
		return "[DONE]"
	}
	if len(events) == 0 {
		return ""
	}
	ev := events[len(events)-1]
	if ev.name != "" {
		return ev.name
	}
	return ev.data
}

// anthropicErr is the error body the Anthropic SDKs parse.
type anthropicErr struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func decodeAnthropic(t *testing.T, raw []byte) anthropicErr {
	t.Helper()
	var e anthropicErr
	if err := json.Unmarshal(raw, &e); err != nil || e.Type != "error" || e.Error.Type == "" || e.Error.Message == "" {
		t.Fatalf("body %s is not Anthropic's error shape", raw)
	}
	return e
}

// TestMessagesAuthAndErrors: /v1/messages takes x-api-key alone, answers
// errors in Anthropic's shape with its types, and refusals with the
// anthropic-ratelimit-* headers; a cut stream ends with Anthropic's error
// event. /v1/responses keeps OpenAI's body and ends a cut stream with its
// own error event.
func TestMessagesAuthAndErrors(t *testing.T) {
	backend := dialectBackend(t)
	limits := limiter.Limits{RequestsPerMinute: 3, TokensPerMinute: 100000}
	e := startEdge(t, edgeOpts{pool: poolOf(backend), limiter: limiter.NewLocal(1), limits: limits})
	msg := `{"model":"messages","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	xKey := []string{"Authorization", "", "x-api-key", testKey, "anthropic-version", "2023-06-01"}

	resp := post(t, h1Client(), e.http+"/v1/messages", msg, xKey...)
	if resp.StatusCode != 200 || lastEvent(t, resp.Body) != "message_stop" {
		t.Fatalf("x-api-key stream: %d", resp.StatusCode)
	}
	resp.Body.Close()
	if resp.Header.Get("anthropic-ratelimit-requests-limit") != "3" || resp.Header.Get("anthropic-ratelimit-requests-remaining") != "2" {
		t.Fatalf("anthropic-ratelimit-requests-*: %v", resp.Header)
	}
	if _, err := time.Parse(time.RFC3339, resp.Header.Get("anthropic-ratelimit-tokens-reset")); err != nil {
		t.Fatalf("anthropic-ratelimit-tokens-reset %q: %v", resp.Header.Get("anthropic-ratelimit-tokens-reset"), err)
	}

	check := func(name string, resp *http.Response, status int, typ string) {
		t.Helper()
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != status {
			t.Fatalf("%s: %d %s; want %d", name, resp.StatusCode, raw, status)
		}
		if got := decodeAnthropic(t, raw); got.Error.Type != typ {
			t.Fatalf("%s: error type %q; want %q", name, got.Error.Type, typ)
		}
	}
	check("bad key", post(t, h1Client(), e.http+"/v1/messages", msg, "Authorization", "", "x-api-key", "nope"), 401, "authentication_error")
	check("bad json", post(t, h1Client(), e.http+"/v1/messages", `{"model":`, xKey...), 400, "invalid_request_error")

	// A cut stream (request 2) ends with event: error in Anthropic's shape.
	resp = post(t, h1Client(), e.http+"/v1/messages", strings.Replace(msg, `"messages",`, `"messages-cut",`, 1), xKey...)
	events, _ := readEvents(t, resp.Body)
	resp.Body.Close()
	if n := len(events); n == 0 || events[n-1].name != "error" {
		t.Fatalf("cut stream's last event %+v; want event: error", events[max(n-1, 0)])
	}
	decodeAnthropic(t, []byte(events[len(events)-1].data))

	// Request 3 is admitted, request 4 refused.
	post(t, h1Client(), e.http+"/v1/messages", msg, xKey...).Body.Close()
	resp = post(t, h1Client(), e.http+"/v1/messages", msg, xKey...)
	if resp.Header.Get("anthropic-ratelimit-requests-remaining") != "0" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("refusal headers %v", resp.Header)
	}
	check("refused", resp, 429, "rate_limit_error")
}

func TestResponsesCutStreamEndsWithErrorEvent(t *testing.T) {
	backend := dialectBackend(t)
	e := startEdge(t, edgeOpts{pool: poolOf(backend)})
	resp := post(t, h2cClient(), e.http+"/v1/responses", `{"model":"responses-cut","stream":true,"input":"hi"}`)
	events, done := readEvents(t, resp.Body)
	resp.Body.Close()
	n := len(events)
	if done || n == 0 || events[n-1].name != "error" {
		t.Fatalf("cut stream ended with %+v (done %v); want event: error", events[max(n-1, 0)], done)
	}
	var ev struct {
		Type, Code, Message string
	}
	if err := json.Unmarshal([]byte(events[n-1].data), &ev); err != nil || ev.Type != "error" || ev.Code == "" || ev.Message == "" {
		t.Fatalf("error event %s is not the Responses API's ResponseErrorEvent", events[n-1].data)
	}
	// Non-streamed errors keep OpenAI's shape on /v1/responses.
	resp = post(t, h1Client(), e.http+"/v1/responses", `{"model":`)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var oe openAIError
	if resp.StatusCode != 400 || json.Unmarshal(raw, &oe) != nil || oe.Error.Message == "" {
		t.Fatalf("bad JSON on /v1/responses: %d %s", resp.StatusCode, raw)
	}
}

// TestDialectsThroughSim: the simulator serves Responses and Messages
// streams and bodies; through the edge they end at their last event and
// settle the simulator's usage (5 tokens out).
func TestDialectsThroughSim(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	lim := &settleRecorder{Local: limiter.NewLocal(1), settled: make(chan limiter.Usage, 1)}
	e := startEdge(t, edgeOpts{pool: poolOf(simURL), limiter: lim, limits: limiter.Limits{TokensPerMinute: 100000}})
	cases := []struct{ path, body, last string }{
		{"/v1/responses", `{"model":"sim-small","stream":true,"max_output_tokens":5,"input":"hello there"}`, "response.incomplete"},
		{"/v1/messages", `{"model":"sim-small","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hello there"}]}`, "message_stop"},
		{"/v1/responses", `{"model":"sim-small","max_output_tokens":5,"input":"hello there"}`, ""},
		{"/v1/messages", `{"model":"sim-small","max_tokens":5,"messages":[{"role":"user","content":"hello there"}]}`, ""},
	}
	for _, c := range cases {
		resp := post(t, h2cClient(), e.http+c.path, c.body, "Authorization", "", "x-api-key", testKey)
		if resp.StatusCode != 200 {
			raw, _ := io.ReadAll(resp.Body)
			t.Fatalf("%s: %d %s", c.path, resp.StatusCode, raw)
		}
		if c.last != "" {
			if last := lastEvent(t, resp.Body); last != c.last {
				t.Fatalf("%s: last event %q; want %q", c.path, last, c.last)
			}
		} else {
			io.Copy(io.Discard, resp.Body)
		}
		resp.Body.Close()
		select {
		case u := <-lim.settled:
			if u.OutputTokens != 5 || u.InputTokens < 1 {
				t.Fatalf("%s %s: settled %+v; want the simulator's usage, 5 out", c.path, c.body, u)
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("%s: nothing settled", c.path)
		}
	}
}

// TestSimToolCallsAndReasoningCounted: the simulator streams reasoning
// deltas then a tool call's arguments (chat), reasoning_text deltas
// (Responses) and thinking deltas (Messages); the edge counts every one of
// them: the trailer's tokens is the whole output, and the chat stream
// settles on its usage.
func TestSimToolCallsAndReasoningCounted(t *testing.T) {
	cfg := fastSim()
	cfg.ReasoningTokens = 3
	_, simURL := startSim(t, cfg)
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"sim-small","stream":true,"max_tokens":8,"tools":[{"type":"function","function":{"name":"get_weather","parameters":{}}}],"messages":[{"role":"user","content":"weather?"}]}`},
		{"/v1/responses", `{"model":"sim-small","stream":true,"max_output_tokens":8,"input":"weather?"}`},
		{"/v1/messages", `{"model":"sim-small","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"weather?"}]}`},
	} {
		resp := post(t, h2Client(), e.https+c.path, c.body, "TE", "trailers")
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", c.path, resp.StatusCode, raw)
		}
		for _, want := range []string{`"reasoning_content":`, `response.reasoning_text.delta`, `"thinking_delta"`, `"tool_calls"`} {
			if strings.Contains(string(raw), want) {
				goto found
			}
		}
		t.Fatalf("%s: no reasoning or tool-call deltas in %s", c.path, raw)
	found:
		if tr := resp.Trailer.Get("Server-Timing"); !strings.Contains(tr, `tokens;desc="8"`) {
			t.Fatalf("%s: trailer %q; want tokens;desc=\"8\" (3 reasoning + 5 output deltas)", c.path, tr)
		}
	}
}

// TestWSBridgeDialects: Responses and Messages requests over the WebSocket
// bridge end with done carrying the backend's usage, after the API's last
// event.
func TestWSBridgeDialects(t *testing.T) {
	_, simURL := startSim(t, fastSim())
	e := startEdge(t, edgeOpts{pool: poolOf(simURL)})
	c := dialWS(t, wsURL(e), keyHeader())
	for _, r := range []struct{ path, body, last string }{
		{"/v1/responses", `{"model":"sim-small","stream":true,"max_output_tokens":5,"input":"hi"}`, `"type":"response.incomplete"`},
		{"/v1/messages", `{"model":"sim-small","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, `"type":"message_stop"`},
	} {
		sendJSON(t, c, map[string]any{"type": "request", "id": r.path, "path": r.path, "body": json.RawMessage(r.body)})
		frames := readUntilTerminal(t, c, 1)
		if len(frames) < 2 {
			t.Fatalf("%s: frames %+v", r.path, frames)
		}
		if last := frames[len(frames)-2]; last.Type != "chunk" || !strings.Contains(string(last.Data), r.last) {
			t.Fatalf("%s: last chunk %s; want %s", r.path, last.Data, r.last)
		}
		if d := frames[len(frames)-1]; d.Type != "done" || d.Usage == nil || d.Usage.CompletionTokens != 5 {
			t.Fatalf("%s: terminal %+v; want done with the backend's usage (5)", r.path, d)
		}
	}
}
