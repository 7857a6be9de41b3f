package loadgen

import (
	"bytes"
	"encoding/json"
)

// chunk is the part of a chat.completion.chunk, completion chunk or
// non-streamed completion that the generator reads. One chunk is reused for
// every event of a stream, so parsing allocates nothing in the steady state.
type chunk struct {
	Choices []choice        `json:"choices"`
	Usage   *usage          `json:"usage"`
	Error   json.RawMessage `json:"error"`
}

type choice struct {
	Delta struct {
		Content          present `json:"content"`
		ReasoningContent present `json:"reasoning_content"`
		Reasoning        present `json:"reasoning"`
		ToolCalls        present `json:"tool_calls"`
	} `json:"delta"`
	Message struct {
		Content   present `json:"content"`
		ToolCalls present `json:"tool_calls"`
	} `json:"message"`
	Text present `json:"text"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// present records whether a JSON value is there and not empty: anything
// but null, "", [] and {}. It decodes without allocating.
type present bool

// UnmarshalJSON implements json.Unmarshaler.
func (p *present) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch string(b) {
	case "", "null", `""`, "[]", "{}":
		*p = false
	default:
		*p = true
	}
	return nil
}

// parse decodes data into c and returns the number of choices that carry
// content (tokens in this event).
func (c *chunk) parse(data []byte) (int, error) {
	clear(c.Choices[:cap(c.Choices)]) // json reuses elements without zeroing them
	c.Choices, c.Usage, c.Error = c.Choices[:0], nil, c.Error[:0]
	if err := json.Unmarshal(data, c); err != nil {
		return 0, err
	}
	n := 0
	for i := range c.Choices {
		ch := &c.Choices[i]
		d := &ch.Delta
		if d.Content || d.ReasoningContent || d.Reasoning || d.ToolCalls || ch.Text ||
			ch.Message.Content || ch.Message.ToolCalls {
			n++
		}
	}
	return n, nil
}

// hasError reports whether the chunk is an error object ({"error": …}).
func (c *chunk) hasError() bool {
	var p present
	_ = p.UnmarshalJSON(c.Error)
	return bool(p)
}

// errorMessage extracts error.message (or the raw error) for a report.
func errorMessage(raw []byte) string {
	var e struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &e) == nil && e.Message != "" {
		return e.Message
	}
	var s string
	if json.Unmarshal(raw, &s) == nil && s != "" {
		return s
	}
	return truncate(string(raw), 200)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
