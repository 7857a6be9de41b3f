package proxy

import (
	"bufio"
	"errors"
	"strings"
	"testing"
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
