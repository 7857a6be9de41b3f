package gpusim

import (
	"encoding/json"
	"strconv"
	"strings"
)

// renderer builds a stream's SSE events from fragments rendered once per
// request, so a token costs a few appends to a reused buffer.
type renderer struct {
	api       api // Responses and Messages render in dialects.go
	id        string
	model     string
	prompt    int
	created   int64
	seq       int    // the Responses stream's next sequence_number
	tool      string // chat: stream tool_calls arguments (vLLM v0.11 tool parsers' shape)
	reasoning int    // the first tokens are reasoning deltas
	chat      bool
	seed      uint64
	prefix    []byte // `{"id":…,"object":…,"created":…,"model":…,`
	head      []byte // `data: ` prefix `"choices":[{"index":0,"delta":` (chat) or `"text":`
	usage     bool   // chunks carry "usage":null (stream_options.include_usage)
	buf       []byte // pending events

	// With stamping on, head is split around the emit-time field:
	// open is `data: ` prefix `"sluice_emit_ns":`, head[stampCut:] the
	// rest after a placeholder of stampWidth spaces. stamps are the
	// offsets in buf of the placeholders that stamp fills in.
	stamp    bool
	open     []byte
	stampCut int
	stamps   []int
}

// EmitField is the top-level chunk field that carries the emit time when
// Config.StampTokens is set.
const EmitField = "sluice_emit_ns"

// stampWidth is the width of an emit-time value: Unix nanoseconds have 19
// digits from 2001 to 2262 (the end of int64 nanoseconds); a shorter value
// is padded with leading spaces, which JSON allows.
const stampWidth = 19

const (
	tailNull  = `,"logprobs":null,"finish_reason":null}]}` + "\n\n"
	tailUsage = `,"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n"
	doneEvent = "data: [DONE]\n\n"
)

func newRenderer(model string, j *job, stamp bool) *renderer {
	object := "text_completion"
	if j.chat {
		object = "chat.completion.chunk"
	}
	p := make([]byte, 0, 128)
	p = append(p, `{"id":"`...)
	p = append(p, j.id...)
	p = append(p, `","object":"`...)
	p = append(p, object...)
	p = append(p, `","created":`...)
	p = strconv.AppendInt(p, j.created, 10)
	p = append(p, `,"model":`...)
	p = append(p, mustJSON(model)...)
	p = append(p, ',')
	rd := &renderer{api: j.api, id: j.id, model: model, prompt: j.prompt, created: j.created,
		chat: j.chat, seed: j.seed, prefix: p, usage: j.includeUsage, tool: j.tool, reasoning: j.reasoning}
	if j.api >= apiResponses {
		stamp = false // emit stamps are for chat and completion chunks
	}
	rd.head = append(append([]byte("data: "), p...), `"choices":[{"index":0,`...)
	if j.chat {
		rd.head = append(rd.head, `"delta":`...)
	} else {
		rd.head = append(rd.head, `"text":`...)
	}
	rd.buf = make([]byte, 0, 1024)
	if stamp {
		rd.stamp = true
		rd.open = append(append([]byte("data: "), p...), `"`+EmitField+`":`...)
		rd.stampCut = len("data: ") + len(p) - 1 // the rest starts with the prefix's comma
		rd.stamps = make([]int, 0, 8)
	}
	return rd
}

// begin appends the start of a choices chunk, up to the choice's delta or
// text value.
func (rd *renderer) begin() {
	if !rd.stamp {
		rd.buf = append(rd.buf, rd.head...)
		return
	}
	rd.placeholder()
	rd.buf = append(rd.buf, rd.head[rd.stampCut:]...)
}

// placeholder appends `data: ` prefix `"sluice_emit_ns":` and a blank
// value that stamp fills in.
func (rd *renderer) placeholder() {
	rd.buf = append(rd.buf, rd.open...)
	rd.stamps = append(rd.stamps, len(rd.buf))
	for range stampWidth {
		rd.buf = append(rd.buf, ' ')
	}
}

// stampAll writes now (Unix nanoseconds) into every pending placeholder.
func (rd *renderer) stampAll(now int64) {
	if len(rd.stamps) == 0 {
		return
	}
	var d [stampWidth]byte
	v := strconv.AppendInt(d[:0], max(now, 0), 10) // ≤ 19 digits: int64
	var field [stampWidth]byte
	for i := range field {
		field[i] = ' '
	}
	copy(field[stampWidth-len(v):], v)
	for _, off := range rd.stamps {
		copy(rd.buf[off:off+stampWidth], field[:])
	}
	rd.stamps = rd.stamps[:0]
}

func (rd *renderer) tail() string {
	if rd.usage {
		return tailUsage
	}
	return tailNull
}

// role appends the chat stream's first chunk, which carries the role.
func (rd *renderer) role() {
	if rd.api >= apiResponses {
		rd.nativeStart()
		return
	}
	rd.begin()
	if rd.tool != "" && rd.reasoning == 0 {
		rd.buf = append(rd.buf, `{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_`...)
		rd.buf = append(rd.buf, rd.id...)
		rd.buf = append(rd.buf, `","type":"function","function":{"name":`...)
		rd.buf = append(rd.buf, mustJSON(rd.tool)...)
		rd.buf = append(rd.buf, `,"arguments":""}}]}`...)
		rd.buf = append(rd.buf, rd.tail()...)
		return
	}
	rd.buf = append(rd.buf, `{"role":"assistant","content":""}`...)
	rd.buf = append(rd.buf, rd.tail()...)
}

// token appends the chunk of token i.
func (rd *renderer) token(i int) {
	if rd.api >= apiResponses {
		rd.nativeToken(i)
		return
	}
	rd.begin()
	switch {
	case rd.chat && i < rd.reasoning:
		rd.buf = append(rd.buf, `{"reasoning_content":`...)
		rd.buf = append(rd.buf, tokenJSON(rd.seed, i, true)...)
		rd.buf = append(rd.buf, '}')
		rd.buf = append(rd.buf, rd.tail()...)
		return
	case rd.chat && rd.tool != "":
		rd.buf = append(rd.buf, `{"tool_calls":[{"index":0,`...)
		if i == rd.reasoning && rd.reasoning > 0 { // the call's first delta names it
			rd.buf = append(rd.buf, `"id":"call_`...)
			rd.buf = append(rd.buf, rd.id...)
			rd.buf = append(rd.buf, `","type":"function",`...)
		}
		rd.buf = append(rd.buf, `"function":{`...)
		if i == rd.reasoning && rd.reasoning > 0 {
			rd.buf = append(rd.buf, `"name":`...)
			rd.buf = append(rd.buf, mustJSON(rd.tool)...)
			rd.buf = append(rd.buf, ',')
		}
		rd.buf = append(rd.buf, `"arguments":`...)
		rd.buf = append(rd.buf, tokenJSON(rd.seed, i, true)...)
		rd.buf = append(rd.buf, `}}]}`...)
		rd.buf = append(rd.buf, rd.tail()...)
		return
	}
	if rd.chat {
		rd.buf = append(rd.buf, `{"content":`...)
		rd.buf = append(rd.buf, tokenJSON(rd.seed, i, true)...)
		rd.buf = append(rd.buf, '}')
	} else {
		rd.buf = append(rd.buf, tokenJSON(rd.seed, i, false)...)
	}
	rd.buf = append(rd.buf, rd.tail()...)
}

// finish appends the chunk that carries finish_reason.
func (rd *renderer) finish(reason string) {
	rd.begin()
	if rd.chat {
		rd.buf = append(rd.buf, `{}`...)
	} else {
		rd.buf = append(rd.buf, `""`...)
	}
	rd.buf = append(rd.buf, `,"logprobs":null,"finish_reason":"`...)
	rd.buf = append(rd.buf, reason...)
	rd.buf = append(rd.buf, `"}]`...)
	if rd.usage {
		rd.buf = append(rd.buf, `,"usage":null`...)
	}
	rd.buf = append(rd.buf, "}\n\n"...)
}

// usageChunk appends the include_usage chunk: no choices, only usage.
// cached is the prompt tokens found in the prefix cache, reported as
// prompt_tokens_details.cached_tokens; negative omits the details (no
// prefix cache).
func (rd *renderer) usageChunk(prompt, completion, cached int) {
	if rd.stamp {
		rd.placeholder()
		rd.buf = append(rd.buf, ',')
	} else {
		rd.buf = append(rd.buf, "data: "...)
		rd.buf = append(rd.buf, rd.prefix...)
	}
	rd.buf = append(rd.buf, `"choices":[],"usage":`...)
	rd.buf = appendUsage(rd.buf, prompt, completion, cached)
	rd.buf = append(rd.buf, "}\n\n"...)
}

func appendUsage(b []byte, prompt, completion, cached int) []byte {
	b = append(b, `{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(completion), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt+completion), 10)
	if cached >= 0 {
		b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
		b = strconv.AppendInt(b, int64(cached), 10)
		b = append(b, '}')
	}
	return append(b, '}')
}

// promptDetails is the usage's prompt_tokens_details (vLLM v0.11,
// vllm/entrypoints/openai/protocol.py PromptTokenUsageInfo).
type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// Usage is the OpenAI usage object.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	// PromptTokensDetails is set when the simulator has a prefix cache.
	PromptTokensDetails *promptDetails `json:"prompt_tokens_details,omitempty"`
}

type chatMessageOut struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type choiceOut struct {
	Index        int             `json:"index"`
	Message      *chatMessageOut `json:"message,omitempty"`
	Text         *string         `json:"text,omitempty"`
	Logprobs     any             `json:"logprobs"`
	FinishReason string          `json:"finish_reason"`
}

type responseOut struct {
	ID      string      `json:"id"`
	Object  string      `json:"object"`
	Created int64       `json:"created"`
	Model   string      `json:"model"`
	Choices []choiceOut `json:"choices"`
	Usage   usage       `json:"usage"`
}

// responseBody renders the non-streamed answer to j.
func responseBody(model string, j *job) []byte {
	var b strings.Builder
	for i := range j.limit {
		b.WriteString(tokenText(j.seed, i, j.chat))
	}
	text := b.String()
	if j.api >= apiResponses {
		return nativeBody(model, j, text)
	}
	c := choiceOut{FinishReason: j.finish}
	out := responseOut{ID: j.id, Object: "text_completion", Created: j.created, Model: model,
		Usage: usage{PromptTokens: j.prompt, CompletionTokens: j.limit, TotalTokens: j.prompt + j.limit}}
	if j.cached >= 0 {
		out.Usage.PromptTokensDetails = &promptDetails{CachedTokens: j.cached}
	}
	if j.chat {
		out.Object = "chat.completion"
		c.Message = &chatMessageOut{Role: "assistant", Content: text}
	} else {
		c.Text = &text
	}
	out.Choices = []choiceOut{c}
	body, _ := json.Marshal(out) // cannot fail: plain strings and numbers
	return body
}
