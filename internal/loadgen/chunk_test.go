package loadgen

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestChunkParse(t *testing.T) {
	tests := []struct {
		name      string
		data      string
		tokens    int
		usage     int // -1: no usage
		hasError  bool
		wantError bool
	}{
		{"vllm content chunk", `{"id":"cmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" the"},"logprobs":null,"finish_reason":null}]}`, 1, -1, false, false},
		{"role chunk", `{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`, 0, -1, false, false},
		{"finish chunk", `{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`, 0, -1, false, false},
		{"usage chunk", `{"choices":[],"usage":{"prompt_tokens":12,"total_tokens":212,"completion_tokens":200}}`, 0, 200, false, false},
		{"usage null", `{"choices":[{"delta":{"content":"x"}}],"usage":null}`, 1, -1, false, false},
		{"two choices", `{"choices":[{"delta":{"content":"a"}},{"delta":{"content":"b"}}]}`, 2, -1, false, false},
		{"whitespace everywhere", "{ \"choices\" : [ { \"delta\" : { \"content\" : \"a\" } } ] ,\n\"usage\"\t: { \"completion_tokens\" : 3 } }", 1, 3, false, false},
		{"escaped quote in content", `{"choices":[{"delta":{"content":"\"\\"}}]}`, 1, -1, false, false},
		{"empty string with spaces is not", `{"choices":[{"delta":{"content":" "}}]}`, 1, -1, false, false},
		{"reasoning_content", `{"choices":[{"delta":{"reasoning_content":"hm","content":null}}]}`, 1, -1, false, false},
		{"tool call", `{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}`, 1, -1, false, false},
		{"empty tool calls", `{"choices":[{"delta":{"tool_calls":[]}}]}`, 0, -1, false, false},
		{"completions text", `{"choices":[{"text":"a","index":0}]}`, 1, -1, false, false},
		{"non-streamed message", `{"choices":[{"message":{"role":"assistant","content":"hello"}}],"usage":{"completion_tokens":5}}`, 1, 5, false, false},
		{"error object", `{"error":{"message":"overloaded","type":"server_error","code":503}}`, 0, -1, true, false},
		{"error null", `{"error":null,"choices":[]}`, 0, -1, false, false},
		{"error string", `{"error":"boom"}`, 0, -1, true, false},
		{"nested unknown values", `{"x":{"y":[1,2.5e-3,true,false,null,{"z":"w"}]},"choices":[{"delta":{"content":"q"},"extra":[[]]}]}`, 1, -1, false, false},
		{"not json", `{not json`, 0, -1, false, true},
		{"truncated", `{"choices":[{"delta":{"content":"a"`, 0, -1, false, true},
		{"trailing garbage", `{"choices":[]} x`, 0, -1, false, true},
		{"bad number", `{"n":01}`, 0, -1, false, true},
		{"bad literal", `{"n":nul}`, 0, -1, false, true},
		{"top-level array", `[1]`, 0, -1, false, true},
		{"control char in string", "{\"a\":\"x\ny\"}", 0, -1, false, true},
		{"too deep", strings.Repeat(`{"a":`, 100) + "1" + strings.Repeat("}", 100), 0, -1, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c chunk
			n, err := c.parse([]byte(tt.data))
			if (err != nil) != tt.wantError {
				t.Fatalf("parse error %v; want error %v", err, tt.wantError)
			}
			if tt.wantError {
				if json.Valid([]byte(tt.data)) && tt.name != "too deep" && tt.name != "top-level array" {
					t.Errorf("rejected valid JSON")
				}
				return
			}
			usage := -1
			if c.hasUsage {
				usage = c.completionTokens
			}
			if n != tt.tokens || usage != tt.usage || c.hasError() != tt.hasError {
				t.Errorf("got tokens %d usage %d error %v; want %d %d %v", n, usage, c.hasError(), tt.tokens, tt.usage, tt.hasError)
			}
		})
	}
}

// FuzzChunkParse checks that parse never panics and that, for valid UTF-8
// without escapes, it rejects what encoding/json rejects. (The walker does
// not validate escape sequences or UTF-8.)
func FuzzChunkParse(f *testing.F) {
	for _, s := range []string{`{"choices":[{"delta":{"content":"a"}}]}`, `{"usage":{"completion_tokens":1}}`,
		`{"error":{}}`, `{"a":[1,-2.5E+3,"x",null]}`, `{"choices":[null]}`, `{`, `{"a":1e}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var c chunk
		_, err := c.parse(data)
		if err == nil && !json.Valid(data) && utf8.Valid(data) && !bytes.ContainsRune(data, '\\') {
			t.Errorf("accepted invalid JSON %q", data)
		}
	})
}

// FuzzChunkFields builds chunks with encoding/json from fuzzed values and
// checks parse reads them back.
func FuzzChunkFields(f *testing.F) {
	f.Add("tok", "", 5, true, false, true)
	f.Add("", "think", 0, false, true, false)
	f.Fuzz(func(t *testing.T, content, reasoning string, completion int, withUsage, withError, indent bool) {
		msg := map[string]any{"object": "chat.completion.chunk", "choices": []any{
			map[string]any{"index": 0, "delta": map[string]any{"content": content, "reasoning_content": reasoning}},
		}}
		if withUsage {
			msg["usage"] = map[string]any{"prompt_tokens": 1, "completion_tokens": completion}
		}
		if withError {
			msg["error"] = map[string]any{"message": content}
		}
		b, err := json.Marshal(msg)
		if err != nil {
			t.Skip()
		}
		if indent {
			var out bytes.Buffer
			_ = json.Indent(&out, b, "", " \t")
			b = out.Bytes()
		}
		var c chunk
		n, err := c.parse(b)
		if err != nil {
			t.Fatalf("parse(%s): %v", b, err)
		}
		want := 0
		if content != "" || reasoning != "" {
			want = 1
		}
		if n != want || c.hasUsage != withUsage || (withUsage && c.completionTokens != completion) || c.hasError() != withError {
			t.Errorf("parse(%s) = %d usage %v/%d error %v", b, n, c.hasUsage, c.completionTokens, c.hasError())
		}
	})
}

func TestIsEmptyJSON(t *testing.T) {
	for v, want := range map[string]bool{`null`: true, `""`: true, `[]`: true, `{}`: true, `[ ]`: true, ` { } `: true,
		`" "`: false, `[0]`: false, `{"a":1}`: false, `0`: false, `false`: false, `"x"`: false} {
		if got := isEmptyJSON([]byte(v)); got != want {
			t.Errorf("isEmptyJSON(%s) = %v; want %v", v, got, want)
		}
	}
}
