package proxy

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/limiter"
)

// scanPieces feeds body to a usageScanner in the given pieces and returns
// what it kept ("" and false when it found no usage).
func scanPieces(pieces ...[]byte) (string, bool) {
	var s usageScanner
	for _, p := range pieces {
		s.feed(p)
	}
	u, ok := s.usage()
	return string(u), ok
}

// usageBodies are non-streamed bodies of the three APIs (shapes: OpenAI
// chat.completion and vLLM v0.11 protocol.py ChatCompletionResponse,
// openai-python v1.109 types/responses/response.py, anthropic-sdk-typescript
// v0.65 resources/messages Message), with what the dialect settles.
var usageBodies = []struct {
	name    string
	dialect dialect
	body    string
	in, out int64
}{
	{"chat", dialectChat, `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,` +
		`"message":{"role":"assistant","content":"a \"usage\": {\"prompt_tokens\": 99} \\ b","reasoning_content":"r"},` +
		`"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46,` +
		`"completion_tokens_details":{"reasoning_tokens":5}}}`, 12, 34},
	{"chat-repeated", dialectChat, `{"usage":{"prompt_tokens":1,"completion_tokens":1},"choices":[],` +
		"\n\t \"usage\" : {\"prompt_tokens\":7 , \"completion_tokens\":8}\n}\n", 7, 8},
	{"completions", dialectCompletions, `{"id":"cmpl-1","object":"text_completion","choices":[{"text":"hi","index":0}],` +
		`"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`, 3, 4},
	{"responses", dialectResponses, `{"id":"resp_1","object":"response","status":"completed","output":[{"type":"message",` +
		`"content":[{"type":"output_text","text":"{\"usage\":{\"input_tokens\":1}}"}]}],"tools":[{"usage":{"input_tokens":0}}],` +
		`"usage":{"input_tokens":17,"input_tokens_details":{"cached_tokens":0},"output_tokens":40,` +
		`"output_tokens_details":{"reasoning_tokens":2},"total_tokens":57}}`, 17, 40},
	{"messages", dialectMessages, `{"id":"msg_1","type":"message","role":"assistant","model":"claude",` +
		`"content":[{"type":"text","text":"hello"},{"type":"tool_use","id":"t","name":"f","input":{"usage":{"input_tokens":3}}}],` +
		`"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":25,"output_tokens":30}}`, 25, 30},
	{"messages-usage-first", dialectMessages, `{"usage":{"input_tokens":5,"output_tokens":6},"id":"msg_1","type":"message",` +
		`"content":[{"type":"text","text":"hello"}]}`, 5, 6},
}

// TestUsageScannerSplitAnywhere: the usage a non-streamed body settles is
// the same whether the body is read whole or streamed through in any
// pieces: byte by byte, and cut in two at every offset.
func TestUsageScannerSplitAnywhere(t *testing.T) {
	for _, c := range usageBodies {
		t.Run(c.name, func(t *testing.T) {
			body := []byte(c.body)
			settle := func(u []byte) *limiter.Usage {
				x := &exchange{dialect: c.dialect}
				x.usageOfBody(u)
				return x.usage
			}
			whole := settle(body)
			if whole == nil || whole.InputTokens != c.in || whole.OutputTokens != c.out {
				t.Fatalf("whole body: usage %+v; want %d/%d", whole, c.in, c.out)
			}
			bytewise := make([][]byte, len(body))
			for i := range body {
				bytewise[i] = body[i : i+1]
			}
			u, ok := scanPieces(bytewise...)
			if got := settle([]byte(u)); !ok || got == nil || *got != *whole {
				t.Fatalf("byte by byte: %q %v -> %+v; want %+v", u, ok, got, whole)
			}
			for i := 0; i <= len(body); i++ {
				u, ok := scanPieces(body[:i], body[i:])
				if got := settle([]byte(u)); !ok || got == nil || *got != *whole {
					t.Fatalf("cut at %d: %q %v -> %+v; want %+v", i, u, ok, got, whole)
				}
			}
		})
	}
}

// TestUsageScannerRefuses: bodies that are not one well-formed object
// settle as without usage, as json.Unmarshal would refuse them.
func TestUsageScannerRefuses(t *testing.T) {
	for _, body := range []string{
		``,
		`null`,
		`[{"usage":{"prompt_tokens":1}}]`,
		`"usage"`,
		`{"usage":{"prompt_tokens":1,"completion_tokens":2}`,        // unclosed
		`{"usage":{"prompt_tokens":1,"completion_tokens":2}}}`,      // extra bracket
		`{"usage":{"prompt_tokens":1,"completion_tokens":2}} {}`,    // a second value
		`{"usage":{"prompt_tokens":1,"completion_tokens":2}} x`,     // trailing bytes
		`{"usage":{"prompt_tokens":1,"completion_tokens":2]}`,       // mismatched
		`{"a":"unterminated, "usage":{"prompt_tokens":1}}`,          // the usage is inside a string
		`{"a":{"usage":{"prompt_tokens":1,"completion_tokens":2}}}`, // not top-level
		`{"Usage":{"prompt_tokens":1,"completion_tokens":2}}`,       // names compared exactly
		`{"usage":{"prompt_tokens":1,"completion_tokens":2},"usage":null}`,
		`{"usage":{"prompt_tokens":"1","completion_tokens":2}}`, // wrong type: the usage reader refuses it
	} {
		u, ok := scanPieces([]byte(body))
		x := &exchange{dialect: dialectChat}
		if ok {
			x.usageOfBody([]byte(u))
		}
		if x.usage != nil {
			t.Errorf("%s: usage %+v (kept %q); want none", body, x.usage, u)
		}
	}
	long := `{"usage":{"prompt_tokens":1,"x":"` + strings.Repeat("y", maxUsageBytes) + `"}}`
	if u, ok := scanPieces([]byte(long)); ok {
		t.Errorf("a usage value over maxUsageBytes was kept (%d bytes)", len(u))
	}
}

// FuzzUsageScanner checks the scanner against encoding/json on random
// splits: for a valid JSON body, the usage value kept is exactly the raw
// value of the last top-level "usage" member as json.Unmarshal into
// map[string]json.RawMessage finds it (names compared exactly, the last
// of a repeated name winning), and nothing when the body is not an object
// or has no such member. Any input must not panic.
func FuzzUsageScanner(f *testing.F) {
	for _, c := range usageBodies {
		f.Add([]byte(c.body), uint64(1))
	}
	f.Add([]byte(`{"usage":null}`), uint64(7))
	f.Add([]byte(`{"us\u0061ge":{"prompt_tokens":2},"a":[1,{"b":"\\\""}]}`), uint64(3))
	f.Add([]byte(`[1,2]`), uint64(0))
	f.Add([]byte(`{"a":"\\","usage":{}}`), uint64(11))
	f.Fuzz(func(t *testing.T, body []byte, seed uint64) {
		r := rand.New(rand.NewPCG(seed, seed>>1|1))
		var pieces [][]byte
		for rest := body; len(rest) > 0; {
			n := 1 + r.IntN(len(rest))
			if r.IntN(3) == 0 {
				n = 1
			}
			pieces = append(pieces, rest[:n])
			rest = rest[n:]
		}
		u, ok := scanPieces(pieces...)
		if !json.Valid(body) {
			return
		}
		var top map[string]json.RawMessage
		var want json.RawMessage
		found := false
		if bytes.HasPrefix(bytes.TrimLeft(body, " \t\r\n"), []byte("{")) && json.Unmarshal(body, &top) == nil {
			want, found = top["usage"]
		}
		if found && len(want) > maxUsageBytes-2 {
			return // not kept, by design
		}
		if ok != found {
			t.Fatalf("%q: found %v; encoding/json found %v (%q)", body, ok, found, want)
		}
		if found {
			if wantObj := `{"usage":` + string(want) + `}`; u != wantObj {
				t.Fatalf("%q: kept %q; want %q", body, u, wantObj)
			}
		}
	})
}
