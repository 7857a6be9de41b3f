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
		if got := string(eventData(ev)); got != w.data {
			t.Fatalf("event %d data: got %q; want %q", i, got, w.data)
		}
	}
	if _, err := readEvent(br, nil); !errors.Is(err, errStreamCut) {
		t.Fatalf("truncated event: got %v; want errStreamCut", err)
	}
}

func TestReadEventTooLarge(t *testing.T) {
	br := bufio.NewReader(strings.NewReader("data: " + strings.Repeat("z", maxEventBytes) + "\n\n"))
	if _, err := readEvent(br, nil); !errors.Is(err, errEventTooLarge) {
		t.Fatalf("got %v; want errEventTooLarge", err)
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
	i := bytes.Index(data, usageKey)
	if i < 0 {
		return nil, false
	}
	rest := bytes.TrimLeft(data[i+len(usageKey):], " ")
	if len(rest) == 0 || rest[0] != '{' {
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
	}
}

func FuzzUsageOf(f *testing.F) {
	for _, s := range usageSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { checkUsageOf(t, []byte(s)) })
}

func checkUsageOf(t *testing.T, data []byte) {
	u, only := usageOf(data)
	lower := bytes.ToLower(data)
	for _, k := range []string{`"usage"`, `"choices"`, `"prompt_tokens"`, `"completion_tokens"`} {
		if bytes.Count(lower, []byte(k)) > 1 {
			return // duplicate names: encoding/json takes the last
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
		{` {"stream":true,"stream_options":{}}`, `{"stream":true,"stream_options":{"include_usage":true}}`},
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
			eventData(ev)
			usageOf(ev)
		}
		if total > len(in) {
			t.Fatalf("read %d bytes from %d", total, len(in))
		}
	})
}

// BenchmarkUsageOf reads the usage of a small non-streamed answer.
//
//	go test -run '^$' -bench BenchmarkUsageOf -benchmem ./proxy/
func BenchmarkUsageOf(b *testing.B) {
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
