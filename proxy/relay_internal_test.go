package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/limiter"
)

func TestReadEvent(t *testing.T) {
	in := "data: a\n\n\n: comment\n\nevent: x\r\ndata: b\r\ndata: c\r\n\r\ndata: " + strings.Repeat("y", 40000) + "\n\ndata: cut"
	br := bufio.NewReaderSize(strings.NewReader(in), 16)
	want := []struct{ ev, data string }{
		{"data: a\n\n", "a"},
		{": comment\n\n", ""},
		{"event: x\r\ndata: b\r\ndata: c\r\n\r\n", "b\nc"},
		{"data: " + strings.Repeat("y", 40000) + "\n\n", strings.Repeat("y", 40000)},
	}
	for i, w := range want {
		ev, err := readEvent(br, nil)
		if err != nil || string(ev) != w.ev {
			t.Fatalf("event %d: got %q, %v; want %q", i, ev, err, w.ev)
		}
		if got := string(EventData(ev)); got != w.data {
			t.Fatalf("event %d data: got %q; want %q", i, got, w.data)
		}
	}
	if _, err := readEvent(br, nil); !errors.Is(err, errStreamCut) {
		t.Fatalf("truncated event: got %v; want errStreamCut", err)
	}
}

func TestReadEventTooLarge(t *testing.T) {
	br := bufio.NewReader(strings.NewReader("data: " + strings.Repeat("z", MaxEventBytes) + "\n\n"))
	if _, err := readEvent(br, nil); !errors.Is(err, ErrEventTooLarge) {
		t.Fatalf("got %v; want ErrEventTooLarge", err)
	}
}

func TestUsageAndTokens(t *testing.T) {
	cases := []struct {
		data      string
		usage     bool
		usageOnly bool
		token     bool
	}{
		{`{"choices":[{"delta":{"content":"hi"}}]}`, false, false, true},
		{`{"choices":[{"delta":{"role":"assistant","content":""}}]}`, false, false, false},
		{`{"choices":[{"delta":{},"finish_reason":"length"}],"usage":null}`, false, false, false},
		{`{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}`, true, true, false},
		{`{"choices":[{"text":" x"}],"usage": {"prompt_tokens":1,"completion_tokens":1}}`, true, false, true},
		{`{"usage":{"prompt_tokens":`, false, false, false},
	}
	for _, c := range cases {
		u, only := usageOf([]byte(c.data))
		if (u != nil) != c.usage || only != c.usageOnly || isToken([]byte(c.data)) != c.token {
			t.Errorf("%s: usage %v only %v token %v; want %v %v %v", c.data, u, only, isToken([]byte(c.data)), c.usage, c.usageOnly, c.token)
		}
	}
	u, _ := usageOf([]byte(cases[3].data))
	if u.InputTokens != 3 || u.OutputTokens != 7 {
		t.Errorf("usage %+v; want 3 in, 7 out", u)
	}
}

// usageOfReference is the former usageOf: the whole chunk decoded.
func usageOfReference(data []byte) (u *limiter.Usage, usageOnly bool) {
	if !bytes.Contains(data, usageKey) { // the gate: the bytes "usage"
		return nil, false
	}
	var c struct {
		Choices []json.RawMessage `json:"choices"`
		Usage   *struct {
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(data, &c) != nil || c.Usage == nil {
		return nil, false
	}
	return &limiter.Usage{InputTokens: c.Usage.PromptTokens, OutputTokens: c.Usage.CompletionTokens}, len(c.Choices) == 0
}

var usageSeeds = []string{
	`{"choices":[{"delta":{"content":"hi"}}]}`,
	`{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}`,
	`{"choices":[{"text":" x"}],"usage": {"prompt_tokens":1,"completion_tokens":1}}`,
	`{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"a \"usage\": {} }"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4,"prompt_tokens_details":{"cached_tokens":0}}}`,
	` { "usage":{"prompt_tokens":2,"completion_tokens":5} , "choices" : [ ] } `,
	`{"choices":null,"usage":{"prompt_tokens":2,"completion_tokens":5}}`,
	`{"x":[1,{"usage":{"prompt_tokens":9}}],"usage":{"completion_tokens":4},"choices":[{}]}`,
	`{"usage":{"prompt_tokens":"x"}}`,
	`{"usage":{"prompt_tokens":1}`,
	`{"usage":null,"choices":[]}`,
	`[{"usage":{"prompt_tokens":1}}]`,
	`{"a":true,"b":null,"c":-1.5e3,"usage":{"prompt_tokens":1,"completion_tokens":2}}`,
}

// usageOf agrees with decoding the whole chunk on valid ASCII JSON (names
// not repeated, written without escapes).
func TestUsageOfMatchesDecoding(t *testing.T) {
	for _, s := range usageSeeds {
		checkUsageOf(t, []byte(s))
		checkUsageOfDecoded(t, []byte(s))
	}
}

func FuzzUsageOf(f *testing.F) {
	for _, s := range usageSeeds {
		f.Add(s)
	}
	for _, c := range usageRules {
		if c.name != "newline after colon" { // usageOfReference skips only spaces there
			f.Add(c.data)
		}
	}
	f.Fuzz(func(t *testing.T, s string) {
		checkUsageOf(t, []byte(s))
		checkUsageOfDecoded(t, []byte(s))
	})
}

// usageBody is what usageOf reads of a chunk, for json.Unmarshal.
type usageBody struct {
	Choices []json.RawMessage `json:"choices"`
	Usage   *struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
	} `json:"usage"`
}

// usageOfDecoded is usageOf by a json.Decoder token walk with exact names,
// the last of a repeated name winning and types checked by json.Unmarshal
// into usageBody's fields, behind the same test for the bytes "usage":.
func usageOfDecoded(data []byte) (u *limiter.Usage, usageOnly bool) {
	if !bytes.Contains(data, usageKey) || !json.Valid(data) {
		return nil, false
	}
	top, ok := exactMembers(data)
	if !ok {
		return nil, false
	}
	var c usageBody
	for _, m := range top {
		switch m.name {
		case "choices":
			if json.Unmarshal(m.value, &c.Choices) != nil {
				return nil, false
			}
		case "usage":
			if m.value[0] == 'n' {
				c.Usage = nil
				continue
			}
			inner, ok := exactMembers(m.value)
			if !ok {
				return nil, false
			}
			c.Usage = &struct {
				PromptTokens     int64 `json:"prompt_tokens"`
				CompletionTokens int64 `json:"completion_tokens"`
			}{}
			for _, t := range inner {
				var n *int64
				switch t.name {
				case "prompt_tokens", "completion_tokens":
					if json.Unmarshal(t.value, &n) != nil {
						return nil, false
					}
				}
				if n == nil {
					continue
				}
				if t.name == "prompt_tokens" {
					c.Usage.PromptTokens = *n
				} else {
					c.Usage.CompletionTokens = *n
				}
			}
		}
	}
	if c.Usage == nil {
		return nil, false
	}
	return &limiter.Usage{InputTokens: c.Usage.PromptTokens, OutputTokens: c.Usage.CompletionTokens}, len(c.Choices) == 0
}

type member struct {
	name  string
	value json.RawMessage
}

// exactMembers lists the members of the valid JSON object data in order
// (false when data is not an object).
func exactMembers(data []byte) ([]member, bool) {
	d := json.NewDecoder(bytes.NewReader(data))
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	var out []member
	for d.More() {
		tok, _ := d.Token()
		var v json.RawMessage
		if d.Decode(&v) != nil {
			return nil, false
		}
		out = append(out, member{tok.(string), v})
	}
	return out, true
}

// checkUsageOfDecoded compares usageOf with usageOfDecoded on any data:
// valid or not, names repeated, escaped or in another case.
func checkUsageOfDecoded(t *testing.T, data []byte) {
	t.Helper()
	u, only := usageOf(data)
	ru, ronly := usageOfDecoded(data)
	if (u == nil) != (ru == nil) || (u != nil && (*u != *ru || only != ronly)) {
		t.Errorf("%q: got %v %v; json.Unmarshal %v %v", data, u, only, ru, ronly)
	}
}

// usageRules are inputs on which usageOf's former scanner (names compared
// as written, the first of a repeated name, the structure checked only up
// to the value) and encoding/json disagreed, which usageOf now reads as
// encoding/json does; the last four it read alike: the deepest nesting,
// and around the colon, where the bytes "usage": gate the scan.
var usageRules = []struct {
	name, data string
	usage      *limiter.Usage
	usageOnly  bool
}{
	{"escaped names", `{"\u0075sage":{"prompt\u005ftokens":2,"completion_tokens":3},"choices":[],"x":"\"usage\":"}`, nil, false},
	{"escaped names with the bytes", `{"x":{"usage":null},"\u0075sage":{"prompt\u005ftokens":2,"completion_tokens":3}}`, &limiter.Usage{InputTokens: 2, OutputTokens: 3}, true},
	{"escaped choices", `{"usage":{"prompt_tokens":1,"completion_tokens":1},"c\u0068oices":[{}]}`, &limiter.Usage{InputTokens: 1, OutputTokens: 1}, false},
	{"last usage wins", `{"usage":{"prompt_tokens":1,"completion_tokens":2},"usage":{"prompt_tokens":5}}`, &limiter.Usage{InputTokens: 5}, true},
	{"names are exact", `{"usage":{"prompt_tokens":1,"completion_tokens":2},"Usage":{"prompt_tokens":5}}`, &limiter.Usage{InputTokens: 1, OutputTokens: 2}, true},
	{"null usage clears", `{"usage":{"prompt_tokens":1,"completion_tokens":2},"usage":null,"usage":{"prompt_tokens":5}}`, &limiter.Usage{InputTokens: 5}, true},
	{"last usage null", `{"usage":{"prompt_tokens":1,"completion_tokens":2},"usage":null}`, nil, false},
	{"null tokens keep", `{"usage":{"prompt_tokens":1,"prompt_tokens":null,"completion_tokens":4}}`, &limiter.Usage{InputTokens: 1, OutputTokens: 4}, true},
	{"token names are exact", `{"usage":{"prompt_tokens":1,"PROMPT_TOKENS":6,"completion_tokens":2}}`, &limiter.Usage{InputTokens: 1, OutputTokens: 2}, true},
	{"last tokens win", `{"usage":{"prompt_tokens":1,"prompt_tokens":6,"completion_tokens":2}}`, &limiter.Usage{InputTokens: 6, OutputTokens: 2}, true},
	{"last choices win", `{"choices":[{}],"usage":{"prompt_tokens":1,"completion_tokens":2},"choices":[]}`, &limiter.Usage{InputTokens: 1, OutputTokens: 2}, true},
	{"null choices", `{"choices":[{}],"choices":null,"usage":{"prompt_tokens":1,"completion_tokens":2}}`, &limiter.Usage{InputTokens: 1, OutputTokens: 2}, true},
	{"object choices", `{"choices":{},"usage":{"prompt_tokens":1,"completion_tokens":2}}`, nil, false},
	{"string choices", `{"choices":"x","usage":{"prompt_tokens":1,"completion_tokens":2}}`, nil, false},
	{"cut after usage", `{"usage":{"prompt_tokens":1,"completion_tokens":2},"choices":[`, nil, false},
	{"cut before choices", `{"usage":{"prompt_tokens":1,"completion_tokens":2}`, nil, false},
	{"trailing bytes", `{"usage":{"prompt_tokens":1,"completion_tokens":2}} x`, nil, false},
	{"invalid nested value", `{"choices":[{"a":[1}]],"usage":{"prompt_tokens":1,"completion_tokens":2}}`, nil, false},
	{"invalid literal", `{"x":nul,"usage":{"prompt_tokens":1,"completion_tokens":2}}`, nil, false},
	{"bad escape", `{"x":"\q","usage":{"prompt_tokens":1,"completion_tokens":2}}`, nil, false},
	{"control character", "{\"x\":\"\n\",\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}", nil, false},
	{"plus sign", `{"usage":{"prompt_tokens":+1,"completion_tokens":2}}`, nil, false},
	{"leading zero", `{"usage":{"prompt_tokens":01,"completion_tokens":2}}`, nil, false},
	{"invalid after tokens", `{"usage":{"prompt_tokens":1,"completion_tokens":2,"x":tru}}`, nil, false},
	{"too deep", `{"x":` + strings.Repeat("[", maxJSONDepth) + strings.Repeat("]", maxJSONDepth) + `,"usage":{"prompt_tokens":1,"completion_tokens":2}}`, nil, false},
	{"deepest", `{"x":` + strings.Repeat("[", maxJSONDepth-1) + strings.Repeat("]", maxJSONDepth-1) + `,"usage":{"prompt_tokens":1,"completion_tokens":2}}`, &limiter.Usage{InputTokens: 1, OutputTokens: 2}, true},
	{"newline after colon", "{\"usage\":\n{\"prompt_tokens\":1,\"completion_tokens\":2}}", &limiter.Usage{InputTokens: 1, OutputTokens: 2}, true},
	{"space before colon", `{"usage" :{"prompt_tokens":1,"completion_tokens":2}}`, &limiter.Usage{InputTokens: 1, OutputTokens: 2}, true},
	{"spaces around colon", `{"choices":[], "usage" : {"prompt_tokens" : 1, "completion_tokens" : 2}}`, &limiter.Usage{InputTokens: 1, OutputTokens: 2}, true},
}

// TestUsageOfRules pins usageOf on the inputs where its former scanner
// disagreed with encoding/json, and on the bytes "usage" that gate it.
func TestUsageOfRules(t *testing.T) {
	for _, c := range usageRules {
		t.Run(c.name, func(t *testing.T) {
			u, only := usageOf([]byte(c.data))
			if (u == nil) != (c.usage == nil) || u != nil && (*u != *c.usage || only != c.usageOnly) {
				t.Errorf("%s: got %v %v; want %v %v", c.data, u, only, c.usage, c.usageOnly)
			}
			checkUsageOfDecoded(t, []byte(c.data))
		})
	}
}

func checkUsageOf(t *testing.T, data []byte) {
	u, only := usageOf(data)
	lower := bytes.ToLower(data)
	for _, k := range []string{`"usage"`, `"choices"`, `"prompt_tokens"`, `"completion_tokens"`} {
		if n := bytes.Count(lower, []byte(k)); n > 1 || n != bytes.Count(data, []byte(k)) {
			return // duplicate names or other cases: encoding/json reads them otherwise
		}
	}
	if !json.Valid(data) || bytes.Contains(data, []byte(`\u`)) || bytes.ContainsFunc(data, func(r rune) bool { return r > 0x7e }) {
		return // usageOf must only not panic
	}
	ru, ronly := usageOfReference(data)
	if (u == nil) != (ru == nil) || (u != nil && (*u != *ru || only != ronly)) {
		t.Errorf("%s: got %v %v; want %v %v", data, u, only, ru, ronly)
	}
}

func TestAskForUsage(t *testing.T) {
	cases := []struct{ in, want string }{
		{`{"stream":true}`, `{"stream_options":{"include_usage":true},"stream":true}`},
		{` {"stream":true,"stream_options":{}}`, ` {"stream":true,"stream_options":{"include_usage":true}}`},
		{`{"stream":true,"stream_options":{"include_usage":false,"x":1}}`, `{"stream":true,"stream_options":{"include_usage":true,"x":1}}`},
	}
	for _, c := range cases {
		m, out, err := parseOpenAI([]byte(c.in))
		if err != nil || string(out) != c.want || !m.Stream {
			t.Errorf("%s: got %s, %v; want %s", c.in, out, err, c.want)
		}
	}
}

func FuzzReadEvent(f *testing.F) {
	f.Add("data: a\n\n: c\n\ndata: [DONE]\n\n")
	f.Add("event: error\r\ndata: {\"error\":{}}\r\n\r\n")
	f.Fuzz(func(t *testing.T, in string) {
		br := bufio.NewReaderSize(strings.NewReader(in), 16)
		total := 0
		for i := 0; i < 10000; i++ {
			ev, err := readEvent(br, nil)
			total += len(ev)
			if err != nil {
				break
			}
			if len(ev) == 0 || ev[len(ev)-1] != '\n' {
				t.Fatalf("event %q does not end with a newline", ev)
			}
			EventData(ev)
			usageOf(ev)
		}
		if total > len(in) {
			t.Fatalf("read %d bytes from %d", total, len(in))
		}
	})
}

// TestUsageNull pins usageOf where usageNull may answer for the scan: a
// single "usage" followed by null is nil, but not when another usage
// follows, escaped or nested, or written in a string.
func TestUsageNull(t *testing.T) {
	cases := []struct {
		data    string
		in, out int64 // -1: nil
	}{
		{`{"choices":[{"delta":{"content":"hi"}}],"usage":null}`, -1, -1},
		{`{"choices":[],"usage" :` + "\n" + ` null }`, -1, -1},
		{`{"usage":null,"usage":{"prompt_tokens":1,"completion_tokens":2}}`, 1, 2},
		{`{"usage":null,"\u0075sage":{"prompt_tokens":1,"completion_tokens":2}}`, 1, 2},
		{`{"x":{"usage":null},"usage":{"prompt_tokens":3,"completion_tokens":4}}`, 3, 4},
		{`{"x":"\"usage\":null","usage":{"prompt_tokens":5,"completion_tokens":6}}`, 5, 6},
		{`{"x":{"usage":null}}`, -1, -1},
		{`{"a\"usage":null}`, -1, -1},
		{`{"usage":nullx}`, -1, -1},
		{`{"usage":{"prompt_tokens":7,"completion_tokens":8}}`, 7, 8},
	}
	for _, c := range cases {
		u, _ := usageOf([]byte(c.data))
		switch {
		case c.in < 0 && u != nil:
			t.Errorf("%s: usage %+v; want nil", c.data, u)
		case c.in >= 0 && (u == nil || u.InputTokens != c.in || u.OutputTokens != c.out):
			t.Errorf("%s: usage %+v; want %d in, %d out", c.data, u, c.in, c.out)
		}
		checkUsageOfDecoded(t, []byte(c.data))
	}
}

// BenchmarkUsageOf reads the usage of a small non-streamed answer, and of
// a token chunk with "usage":null (a client that asked for usage).
//
//	go test -run '^$' -bench BenchmarkUsageOf -benchmem ./proxy/
func BenchmarkUsageOf(b *testing.B) {
	chunk := []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}],"usage":null}`)
	b.Run("chunk-usage-null", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			usageOf(chunk)
		}
	})
	body := []byte(usageSeeds[3])
	b.Run("scan", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			usageOf(body)
		}
	})
	b.Run("decode-whole", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			usageOfReference(body)
		}
	})
}
