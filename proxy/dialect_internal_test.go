package proxy

import (
	"slices"
	"testing"
)

// classifyCase is one event and what classify makes of it.
type classifyCase struct {
	name string
	d    dialect
	ev   string
	want eventKind
}

// classifyCases are one event of each kind the relay reads per token.
var classifyCases = []classifyCase{
	{"chat-content", dialectChat, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":null}]}` + "\n\n", eventToken},
	{"chat-spaced", dialectChat, `data: {"id": "c", "choices": [{"index": 0, "delta": {"content" : " word"}}]}` + "\n\n", eventToken},
	{"chat-role", dialectChat, `data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\n", eventOther},
	{"chat-null-content", dialectChat, `data: {"id":"c","choices":[{"index":0,"delta":{"content":null,"tool_calls":[{"index":0,"function":{"arguments":"{\""}}]}}]}` + "\n\n", eventToken},
	{"chat-reasoning", dialectChat, `data: {"choices":[{"delta":{"reasoning_content":"hm"}}]}` + "\n\n", eventToken},
	{"chat-usage", dialectChat, `data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}` + "\n\n", eventUsageDrop},
	{"chat-escaped-key", dialectChat, `data: {"choices":[{"delta":{"content":"","x":"\"content\": \"no\""}}]}` + "\n\n", eventOther},
	{"responses-delta", dialectResponses, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":5,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\" word\"}\n\n", eventToken},
	{"responses-empty-delta", dialectResponses, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"\"}\n\n", eventOther},
	{"responses-no-event-line", dialectResponses, "data: {\"sequence_number\":5,\"type\":\"response.function_call_arguments.delta\",\"delta\":\"{\"}\n\n", eventToken},
	{"responses-done", dialectResponses, "event: response.output_text.done\ndata: {\"type\":\"response.output_text.done\",\"text\":\"all\"}\n\n", eventOther},
	{"responses-completed", dialectResponses, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":9}}}\n\n", eventEnd},
	{"responses-failed", dialectResponses, "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\"}}\n\n", eventFailed},
	{"messages-delta", dialectMessages, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" word\"}}\n\n", eventToken},
	{"messages-signature", dialectMessages, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"Eq\"}}\n\n", eventOther},
	{"messages-delta-usage", dialectMessages, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":12}}\n\n", eventUsage},
	{"messages-stop", dialectMessages, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", eventEnd},
	{"messages-error", dialectMessages, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n", eventFailed},
}

func TestClassify(t *testing.T) {
	for _, c := range classifyCases {
		x := &exchange{dialect: c.d}
		ev := []byte(c.ev)
		if got := x.classify(ev, EventData(ev)); got != c.want {
			t.Errorf("%s: %d; want %d", c.name, got, c.want)
		}
	}
	x := &exchange{dialect: dialectMessages}
	for _, ev := range []string{
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n",
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":30}}\n\n",
	} {
		x.classify([]byte(ev), EventData([]byte(ev)))
	}
	if x.usage == nil || x.usage.InputTokens != 25 || x.usage.OutputTokens != 30 {
		t.Fatalf("messages usage %+v; want 25 in (message_start), 30 out (message_delta)", x.usage)
	}
}

// TestEndsStream: endsStream (the hand-off's side-effect-free test for a
// stream's last event) agrees with classify on every case, and on chat's
// [DONE], Responses' incomplete and error events.
func TestEndsStream(t *testing.T) {
	cases := append(slices.Clone(classifyCases),
		classifyCase{"chat-done", dialectChat, "data: [DONE]\n\n", eventEnd},
		classifyCase{"responses-incomplete", dialectResponses, "event: response.incomplete\ndata: {\"type\":\"response.incomplete\"}\n\n", eventEnd},
		classifyCase{"responses-error", dialectResponses, "event: error\ndata: {\"type\":\"error\",\"code\":\"x\"}\n\n", eventFailed},
	)
	for _, c := range cases {
		ev := []byte(c.ev)
		kind := (&exchange{dialect: c.d}).classify(ev, EventData(ev))
		if kind != c.want {
			t.Fatalf("%s: classify %d; want %d", c.name, kind, c.want)
		}
		end := kind == eventEnd || kind == eventFailed
		if got := (&exchange{dialect: c.d}).endsStream(ev, EventData(ev)); got != end {
			t.Errorf("%s: endsStream %v; classify says %d", c.name, got, kind)
		}
	}
}

// TestNextEvent: the hand-off's split of buffered input finds what the
// loop's split finds (blank lines ending events: \n\n and \r\n\r\n; stray
// blank lines skipped) and nothing in an incomplete event.
func TestNextEvent(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"data: a\n\ndata: b\n\n", "data: a\n\n"},
		{"\n\r\ndata: a\r\n\r\nrest", "data: a\r\n\r\n"},
		{"event: x\ndata: a\n\n", "event: x\ndata: a\n\n"},
		{"data: a\n", ""},
		{"data: a", ""},
		{"\n\n", ""},
		{"", ""},
	} {
		start, end := nextEvent([]byte(c.in))
		if got := c.in[start:end]; end == 0 && c.want != "" || got != c.want {
			t.Errorf("nextEvent(%q) = %q; want %q", c.in, c.in[start:end], c.want)
		}
	}
}

// BenchmarkRelayClassify is the relay's per-event classification cost for
// each kind of event (0 allocations expected).
func BenchmarkRelayClassify(b *testing.B) {
	for _, c := range classifyCases {
		if c.want == eventUsage || c.want == eventUsageDrop || c.want == eventEnd {
			continue // once a stream
		}
		b.Run(c.name, func(b *testing.B) {
			x := &exchange{dialect: c.d}
			ev := []byte(c.ev)
			b.ReportAllocs()
			for b.Loop() {
				x.classify(ev, EventData(ev))
			}
		})
	}
}

// TestReadUsageIgnoresEchoedFields: a request's tools, schema or metadata
// echoed in response.completed cannot pass for the backend's usage.
func TestReadUsageIgnoresEchoedFields(t *testing.T) {
	x := &exchange{dialect: dialectResponses}
	ev := []byte("event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"tools\":[{\"parameters\":{\"usage\":{\"input_tokens\":0,\"output_tokens\":0}}}],\"usage\":{\"input_tokens\":7,\"output_tokens\":9},\"metadata\":{\"usage\":{\"output_tokens\":1}}}}\n\n")
	if k := x.classify(ev, EventData(ev)); k != eventEnd || x.usage == nil || x.usage.InputTokens != 7 || x.usage.OutputTokens != 9 {
		t.Fatalf("kind %d usage %+v; want end with 7 in, 9 out", k, x.usage)
	}
	x = &exchange{dialect: dialectResponses}
	ev = []byte("event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"tools\":[{\"parameters\":{\"usage\":{\"input_tokens\":0,\"output_tokens\":0}}}],\"usage\":null}}\n\n")
	if x.classify(ev, EventData(ev)); x.usage != nil {
		t.Fatalf("usage %+v from an echoed tool schema; want none (the counted deltas settle)", x.usage)
	}
}
