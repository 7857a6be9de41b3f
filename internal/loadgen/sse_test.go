package loadgen

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

type sseGot struct {
	kind        sseKind
	event, data string
}

// readAllEvents reads r to the end and returns what it found.
func readAllEvents(t *testing.T, r io.Reader) ([]sseGot, error) {
	t.Helper()
	sr := newSSEReader(r)
	var got []sseGot
	for {
		kind, err := sr.next()
		if err != nil {
			return got, err
		}
		switch kind {
		case sseEvent:
			got = append(got, sseGot{kind, string(sr.event), string(sr.data)})
		case sseTiming:
			got = append(got, sseGot{kind, "", string(sr.comment)})
		}
	}
}

func TestSSEReader(t *testing.T) {
	tests := []struct {
		name  string
		input string
		want  []sseGot
	}{
		{"one event", "data: {\"a\":1}\n\n", []sseGot{{sseEvent, "", `{"a":1}`}}},
		{"multi-line data joined with LF", "data: line1\ndata: line2\ndata:line3\n\n",
			[]sseGot{{sseEvent, "", "line1\nline2\nline3"}}},
		{"CRLF line ends", "data: a\r\n\r\ndata: [DONE]\r\n\r\n",
			[]sseGot{{sseEvent, "", "a"}, {sseEvent, "", "[DONE]"}}},
		{"comments and unknown fields ignored", ": keep-alive\nid: 7\nretry: 10\nfoo\ndata: x\n\n:\n\n",
			[]sseGot{{sseEvent, "", "x"}}},
		{"event type", "event: error\ndata: {\"error\":{}}\n\n", []sseGot{{sseEvent, "error", `{"error":{}}`}}},
		{"event type resets between events", "event: error\ndata: 1\n\ndata: 2\n\n",
			[]sseGot{{sseEvent, "error", "1"}, {sseEvent, "", "2"}}},
		{"blank lines without fields dispatch nothing", "\n\n\ndata: x\n\n\n", []sseGot{{sseEvent, "", "x"}}},
		{"only one leading space is removed", "data:  two\n\n", []sseGot{{sseEvent, "", " two"}}},
		{"server-timing comment", ": server-timing decode;dur=12, tokens;dur=3\ndata: [DONE]\n\n",
			[]sseGot{{sseTiming, "", "decode;dur=12, tokens;dur=3"}, {sseEvent, "", "[DONE]"}}},
		{"server-timing comment with colon", ":Server-Timing: x;dur=1\n\n", []sseGot{{sseTiming, "", "x;dur=1"}}},
		{"other comment that starts alike", ": server-timings x\n\n", nil},
		{"incomplete event at EOF is dropped", "data: a\n\ndata: [DONE]\n", []sseGot{{sseEvent, "", "a"}}},
		{"unterminated line at EOF is dropped", "data: a\n\ndata: [DO", []sseGot{{sseEvent, "", "a"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, mode := range []struct {
				name string
				r    func(string) io.Reader
			}{
				{"whole", func(s string) io.Reader { return strings.NewReader(s) }},
				{"one byte per read", func(s string) io.Reader { return iotest.OneByteReader(strings.NewReader(s)) }},
			} {
				got, err := readAllEvents(t, mode.r(tt.input))
				if !errors.Is(err, io.EOF) {
					t.Errorf("%s: err = %v; want io.EOF", mode.name, err)
				}
				if len(got) != len(tt.want) {
					t.Fatalf("%s: got %d items %+v; want %+v", mode.name, len(got), got, tt.want)
				}
				for i := range got {
					if got[i] != tt.want[i] {
						t.Errorf("%s: item %d = %+v; want %+v", mode.name, i, got[i], tt.want[i])
					}
				}
			}
		})
	}
}

func TestSSEReaderLongLine(t *testing.T) {
	long := strings.Repeat("x", 100<<10) // larger than the 16 KiB buffer
	got, err := readAllEvents(t, strings.NewReader("data: "+long+"\n\ndata: y\n\n"))
	if !errors.Is(err, io.EOF) || len(got) != 2 || got[0].data != long || got[1].data != "y" {
		t.Fatalf("long line: err %v, %d events", err, len(got))
	}
	_, err = readAllEvents(t, strings.NewReader("data: "+strings.Repeat("y", maxEventSize+10)+"\n\n"))
	if !errors.Is(err, errEventTooLarge) {
		t.Errorf("oversized event: err = %v; want errEventTooLarge", err)
	}
}

func TestSSEReaderReadError(t *testing.T) {
	boom := errors.New("connection reset")
	r := io.MultiReader(strings.NewReader("data: a\n\n"), iotest.ErrReader(boom))
	got, err := readAllEvents(t, r)
	if len(got) != 1 || !errors.Is(err, boom) {
		t.Errorf("got %v, %v; want one event then the read error", got, err)
	}
}

const (
	roleChunk  = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
	tokenChunk = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n"
	usageChunk = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":42}}\n\n"
	doneEvent  = "data: [DONE]\n\n"
)

// readTestStream runs readStream and finishStream over a canned body.
func readTestStream(t *testing.T, body io.Reader) Result {
	t.Helper()
	var res Result
	res.Status = 200
	ctx := context.Background()
	start := time.Now()
	err := readStream(body, start, &res, func() {})
	finishStream(ctx, err, start, &res)
	return res
}

func TestReadStream(t *testing.T) {
	t.Run("complete stream", func(t *testing.T) {
		body := roleChunk + tokenChunk + tokenChunk + ": keep-alive\n\n" + tokenChunk + usageChunk +
			": server-timing decode;dur=20\n\n" + doneEvent
		res := readTestStream(t, iotest.HalfReader(strings.NewReader(body)))
		if res.Class != ClassOK || !res.Done || res.Truncated {
			t.Fatalf("class %q done %v truncated %v; want ok, done", res.Class, res.Done, res.Truncated)
		}
		if res.TTFT <= 0 || len(res.ITL) != 2 || res.E2E < res.TTFT {
			t.Errorf("ttft %v, %d itl samples, e2e %v; want ttft > 0, 2 samples, e2e >= ttft", res.TTFT, len(res.ITL), res.E2E)
		}
		if res.TokensOut != 42 {
			t.Errorf("tokens %d; want 42 from usage", res.TokensOut)
		}
		if res.Events != 6 {
			t.Errorf("events %d; want 6", res.Events)
		}
		if d, ok := Lookup(res.Timing, "decode"); !ok || d != 20 {
			t.Errorf("server-timing comment not read: %+v", res.Timing)
		}
	})
	t.Run("tokens counted without usage", func(t *testing.T) {
		res := readTestStream(t, strings.NewReader(roleChunk+tokenChunk+tokenChunk+tokenChunk+doneEvent))
		if res.TokensOut != 3 || res.Class != ClassOK {
			t.Errorf("tokens %d class %q; want 3, ok", res.TokensOut, res.Class)
		}
	})
	t.Run("truncated at EOF", func(t *testing.T) {
		res := readTestStream(t, strings.NewReader(roleChunk+tokenChunk+tokenChunk))
		if res.Class != ClassTruncated || !res.Truncated || res.Done {
			t.Errorf("class %q truncated %v; want truncated", res.Class, res.Truncated)
		}
		if res.TTFT <= 0 || res.TokensOut != 2 {
			t.Errorf("ttft %v tokens %d; want the tokens received before the cut", res.TTFT, res.TokensOut)
		}
	})
	t.Run("truncated by a connection error", func(t *testing.T) {
		res := readTestStream(t, io.MultiReader(strings.NewReader(roleChunk+tokenChunk),
			iotest.ErrReader(io.ErrUnexpectedEOF)))
		if res.Class != ClassTruncated || !strings.Contains(res.Err, "unexpected EOF") {
			t.Errorf("class %q err %q; want truncated with the cause", res.Class, res.Err)
		}
	})
	t.Run("[DONE] without its blank line is truncated", func(t *testing.T) {
		res := readTestStream(t, strings.NewReader(tokenChunk+"data: [DONE]\n"))
		if res.Class != ClassTruncated {
			t.Errorf("class %q; want truncated", res.Class)
		}
	})
	t.Run("error chunk", func(t *testing.T) {
		res := readTestStream(t, strings.NewReader(tokenChunk+
			"data: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n"))
		if res.Class != ClassStreamError || res.Truncated || res.Err != "overloaded" {
			t.Errorf("class %q truncated %v err %q; want stream_error, not truncated", res.Class, res.Truncated, res.Err)
		}
	})
	t.Run("error event type", func(t *testing.T) {
		res := readTestStream(t, strings.NewReader(tokenChunk+"event: error\ndata: {\"message\":\"bye\"}\n\n"))
		if res.Class != ClassStreamError || res.Err != "bye" {
			t.Errorf("class %q err %q; want stream_error bye", res.Class, res.Err)
		}
	})
	t.Run("malformed event", func(t *testing.T) {
		res := readTestStream(t, strings.NewReader(tokenChunk+"data: {not json\n\n"+doneEvent))
		if res.Class != ClassProtocol {
			t.Errorf("class %q; want protocol", res.Class)
		}
	})
	t.Run("reasoning and completions text count as tokens", func(t *testing.T) {
		body := "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hmm\"}}]}\n\n" +
			"data: {\"choices\":[{\"text\":\"a\"}]}\n\n" +
			"data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0}]}}]}\n\n" +
			"data: {\"choices\":[{\"delta\":{\"content\":null}}]}\n\n" + doneEvent
		res := readTestStream(t, strings.NewReader(body))
		if res.TokensOut != 3 || len(res.ITL) != 2 {
			t.Errorf("tokens %d itl %d; want 3 and 2", res.TokensOut, len(res.ITL))
		}
	})
}

func TestChunkReuseDoesNotLeakFields(t *testing.T) {
	var c chunk
	if n, _ := c.parse([]byte(`{"choices":[{"delta":{"content":"x"}},{"delta":{"content":"y"}}]}`)); n != 2 {
		t.Fatalf("n = %d; want 2", n)
	}
	if n, _ := c.parse([]byte(`{"choices":[{"delta":{}},{"delta":{"role":"assistant"}}]}`)); n != 0 {
		t.Errorf("n = %d after empty deltas; want 0 (fields of the previous chunk leaked)", n)
	}
	if _, _ = c.parse([]byte(`{"choices":[]}`)); c.hasError() || c.hasUsage {
		t.Error("error or usage leaked into the next chunk")
	}
}
