package gpusim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestChatStreamShape(t *testing.T) {
	_, url := startSim(t, fast())
	resp := post(t, context.Background(), url, "/v1/chat/completions", chatBody(5, true, false))
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q; want text/event-stream", ct)
	}
	evs, done, err := readEvents(t, resp.Body)
	if err != nil || !done {
		t.Fatalf("stream ended with done=%v err=%v", done, err)
	}
	// role chunk + 5 tokens + finish chunk
	if len(evs) != 7 {
		t.Fatalf("got %d events; want 7: %v", len(evs), evs)
	}
	var text strings.Builder
	first := decodeChunk(t, evs[0].data)
	for i, ev := range evs {
		c := decodeChunk(t, ev.data)
		if c.Object != "chat.completion.chunk" || c.ID != first.ID || c.Model != "sim-small" ||
			c.Created == 0 || !strings.HasPrefix(c.ID, "chatcmpl-") || c.Usage != nil {
			t.Errorf("event %d: bad envelope %s", i, ev.data)
		}
		if len(c.Choices) != 1 || c.Choices[0].Delta == nil {
			t.Fatalf("event %d: want one choice with a delta: %s", i, ev.data)
		}
		ch := c.Choices[0]
		switch {
		case i == 0:
			if ch.Delta.Role == nil || *ch.Delta.Role != "assistant" || ch.Delta.Content == nil || *ch.Delta.Content != "" {
				t.Errorf("first chunk %s; want role assistant and empty content", ev.data)
			}
		case i == len(evs)-1:
			if ch.FinishReason == nil || *ch.FinishReason != "length" || ch.Delta.Content != nil {
				t.Errorf("last chunk %s; want empty delta and finish_reason length", ev.data)
			}
		default:
			if ch.Delta.Role != nil || ch.Delta.Content == nil || *ch.Delta.Content == "" || ch.FinishReason != nil {
				t.Errorf("token chunk %s; want content only", ev.data)
			}
			text.WriteString(*ch.Delta.Content)
		}
	}
	if got := strings.Count(text.String(), " "); got != 4 {
		t.Errorf("text %q: want 5 words, the first without a leading space", text.String())
	}

	// The same prompt unstreamed gives the same text.
	resp2 := post(t, context.Background(), url, "/v1/chat/completions", chatBody(5, false, false))
	defer resp2.Body.Close()
	var out struct {
		Object  string `json:"object"`
		Choices []struct {
			Message      chatMessageOut `json:"message"`
			FinishReason string         `json:"finish_reason"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	if err := json.NewDecoder(resp2.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if out.Object != "chat.completion" || len(out.Choices) != 1 || out.Choices[0].Message.Role != "assistant" {
		t.Fatalf("unstreamed answer %+v", out)
	}
	if got := out.Choices[0].Message.Content; got != text.String() {
		t.Errorf("unstreamed content %q; want streamed %q", got, text.String())
	}
	if u := out.Usage; u.CompletionTokens != 5 || u.PromptTokens != estimateTokens(len("Tell me about continuous batching.")) ||
		u.TotalTokens != u.PromptTokens+5 {
		t.Errorf("usage %+v", u)
	}
}

func TestCompletionStreamShape(t *testing.T) {
	_, url := startSim(t, fast())
	body := `{"model":"sim-small","prompt":"Once upon a time","max_tokens":4,"stream":true}`
	resp := post(t, context.Background(), url, "/v1/completions", body)
	defer resp.Body.Close()
	evs, done, err := readEvents(t, resp.Body)
	if err != nil || !done || len(evs) != 5 {
		t.Fatalf("got %d events, done=%v err=%v; want 5 and [DONE]", len(evs), done, err)
	}
	for i, ev := range evs {
		c := decodeChunk(t, ev.data)
		if c.Object != "text_completion" || !strings.HasPrefix(c.ID, "cmpl-") || len(c.Choices) != 1 ||
			c.Choices[0].Text == nil || c.Choices[0].Delta != nil {
			t.Fatalf("event %d: %s", i, ev.data)
		}
		text, fin := *c.Choices[0].Text, c.Choices[0].FinishReason
		if i < 4 && (!strings.HasPrefix(text, " ") || fin != nil) {
			t.Errorf("token event %d: %s; want a leading-space word", i, ev.data)
		}
		if i == 4 && (text != "" || fin == nil || *fin != "length") {
			t.Errorf("last event %s; want empty text and finish_reason length", ev.data)
		}
	}
}

func TestIncludeUsage(t *testing.T) {
	_, url := startSim(t, fast())
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		for _, on := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/usage=%v", path, on), func(t *testing.T) {
				body := chatBody(3, true, on)
				if path == "/v1/completions" {
					body = fmt.Sprintf(`{"prompt":"twelve chars","max_tokens":3,"stream":true,"stream_options":{"include_usage":%v}}`, on)
				}
				resp := post(t, context.Background(), url, path, body)
				defer resp.Body.Close()
				evs, done, err := readEvents(t, resp.Body)
				if err != nil || !done {
					t.Fatalf("done=%v err=%v", done, err)
				}
				last := decodeChunk(t, evs[len(evs)-1].data)
				if !on {
					if last.Usage != nil || len(last.Choices) != 1 {
						t.Errorf("last event %s; want no usage chunk", evs[len(evs)-1].data)
					}
					if strings.Contains(evs[0].data, `"usage"`) {
						t.Errorf("chunk %s carries usage without include_usage", evs[0].data)
					}
					return
				}
				if len(last.Choices) != 0 || last.Usage == nil || last.Usage.CompletionTokens != 3 ||
					last.Usage.TotalTokens != last.Usage.PromptTokens+3 || last.Usage.PromptTokens < 1 {
					t.Errorf("last event %s; want empty choices and usage", evs[len(evs)-1].data)
				}
				if !strings.Contains(evs[0].data, `"usage":null`) {
					t.Errorf("chunk %s; want usage:null with include_usage", evs[0].data)
				}
			})
		}
	}
}

func TestMaxTokens(t *testing.T) {
	_, url := startSim(t, Config{StepBase: -1, StepPerSeq: -1, PrefillBase: -1, PrefillPerToken: -1, DefaultMaxTokens: 9})
	tests := []struct {
		name       string
		fields     string
		wantTokens int
		wantFinish string
	}{
		{"default", ``, 9, "stop"},
		{"max_tokens", `,"max_tokens":1`, 1, "length"},
		{"max_tokens 17", `,"max_tokens":17`, 17, "length"},
		{"max_completion_tokens wins", `,"max_tokens":10,"max_completion_tokens":3`, 3, "length"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, stream := range []bool{false, true} {
				body := fmt.Sprintf(`{"messages":[{"role":"user","content":"hi"}],"stream":%v%s}`, stream, tt.fields)
				resp := post(t, context.Background(), url, "/v1/chat/completions", body)
				got, finish := countTokens(t, resp, stream)
				if got != tt.wantTokens || finish != tt.wantFinish {
					t.Errorf("stream=%v: got %d tokens, finish %q; want %d, %q", stream, got, finish, tt.wantTokens, tt.wantFinish)
				}
			}
		})
	}
}

// countTokens returns the completion tokens and finish_reason of a chat
// answer.
func countTokens(t *testing.T, resp *http.Response, stream bool) (int, string) {
	t.Helper()
	defer resp.Body.Close()
	if !stream {
		var out struct {
			Choices []struct {
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage usage `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Choices) != 1 {
			t.Fatalf("decoding: %v", err)
		}
		return out.Usage.CompletionTokens, out.Choices[0].FinishReason
	}
	evs, done, err := readEvents(t, resp.Body)
	if err != nil || !done {
		t.Fatalf("done=%v err=%v", done, err)
	}
	n, finish := 0, ""
	for _, ev := range evs {
		c := decodeChunk(t, ev.data)
		if ch := c.Choices[0]; ch.Delta.Content != nil && *ch.Delta.Content != "" {
			n++
		} else if ch.FinishReason != nil {
			finish = *ch.FinishReason
		}
	}
	return n, finish
}

func TestStopWord(t *testing.T) {
	_, url := startSim(t, Config{StepBase: -1, StepPerSeq: -1, PrefillBase: -1, PrefillPerToken: -1})
	body := `{"prompt":"stop test","max_tokens":40}`
	resp := post(t, context.Background(), url, "/v1/completions", body)
	var full struct {
		Choices []struct{ Text string } `json:"choices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&full); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	words := strings.Fields(full.Choices[0].Text)
	if len(words) != 40 {
		t.Fatalf("got %d words; want 40", len(words))
	}
	stop := words[5]
	want := strings.Join(words[:indexOf(words, stop)], " ") // the first occurrence ends it
	body = fmt.Sprintf(`{"prompt":"stop test","max_tokens":40,"stop":[%q]}`, stop)
	resp = post(t, context.Background(), url, "/v1/completions", body)
	defer resp.Body.Close()
	var out struct {
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(out.Choices[0].Text); got != want || out.Choices[0].FinishReason != "stop" {
		t.Errorf("got %q, %q; want %q, stop", got, out.Choices[0].FinishReason, want)
	}
}

func indexOf(words []string, w string) int {
	for i, x := range words {
		if x == w {
			return i
		}
	}
	return -1
}

func TestErrors(t *testing.T) {
	_, url := startSim(t, fast())
	tests := []struct {
		name, path, body string
		hdr              []string
		status           int
		code             string
	}{
		{"malformed JSON", "/v1/chat/completions", `{"messages":[`, nil, 400, "invalid_json"},
		{"malformed JSON completions", "/v1/completions", `nope`, nil, 400, "invalid_json"},
		{"malformed JSON embeddings", "/v1/embeddings", `{"input":}`, nil, 400, "invalid_json"},
		{"wrong type", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":"9"}`, nil, 400, "invalid_json"},
		{"unknown model", "/v1/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}`, nil, 404, "model_not_found"},
		{"unknown model completions", "/v1/completions", `{"model":"gpt-9","prompt":"x"}`, nil, 404, "model_not_found"},
		{"unknown model embeddings", "/v1/embeddings", `{"model":"gpt-9","input":"x"}`, nil, 404, "model_not_found"},
		{"no messages", "/v1/chat/completions", `{"messages":[]}`, nil, 400, "invalid_value"},
		{"no prompt", "/v1/completions", `{"max_tokens":3}`, nil, 400, "invalid_value"},
		{"max_tokens 0", "/v1/completions", `{"prompt":"x","max_tokens":0}`, nil, 400, "invalid_value"},
		{"too long", "/v1/completions", `{"prompt":"x","max_tokens":1000000}`, nil, 400, "context_length_exceeded"},
		{"n 2", "/v1/completions", `{"prompt":"x","n":2}`, nil, 400, "invalid_value"},
		{"bad content", "/v1/chat/completions", `{"messages":[{"role":"user","content":7}]}`, nil, 400, "invalid_value"},
		{"bad header", "/v1/completions", `{"prompt":"x"}`, []string{HeaderDieAfter, "many"}, 400, "invalid_header"},
		{"bad fail header", "/v1/completions", `{"prompt":"x"}`, []string{HeaderFail, "sometimes"}, 400, "invalid_header"},
		{"unknown path", "/v1/nothing", `{}`, nil, 404, "not_found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantError(t, post(t, context.Background(), url, tt.path, tt.body, tt.hdr...), tt.status, tt.code)
		})
	}
	t.Run("method", func(t *testing.T) {
		resp, err := http.Get(url + "/v1/chat/completions")
		if err != nil {
			t.Fatal(err)
		}
		if resp.Header.Get("Allow") != "POST" {
			t.Errorf("Allow %q; want POST", resp.Header.Get("Allow"))
		}
		wantError(t, resp, http.StatusMethodNotAllowed, "method_not_allowed")
	})
}

func TestModelsAndHealth(t *testing.T) {
	_, url := startSim(t, Config{Model: "tiny-1"})
	resp, err := http.Get(url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "ok" {
		t.Errorf("/health: %d %q; want 200 ok", resp.StatusCode, body)
	}
	resp, err = http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list modelList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	if list.Object != "list" || len(list.Data) != 1 || list.Data[0].ID != "tiny-1" || list.Data[0].Object != "model" {
		t.Errorf("/v1/models: %+v", list)
	}
}
