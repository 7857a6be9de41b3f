package proxy

import (
	"encoding/json"
	"strings"
	"testing"
)

// parseOpenAIReference is the former parseOpenAI: the whole body decoded.
func parseOpenAIReference(body []byte) (requestMeta, []byte, error) {
	var b openAIBody
	if err := json.Unmarshal(body, &b); err != nil {
		return requestMeta{}, nil, badRequest("invalid_json", "request body is not valid JSON: "+jsonProblem(err))
	}
	m := requestMeta{Model: b.Model, Stream: b.Stream}
	if b.StreamOptions != nil && b.StreamOptions.IncludeUsage != nil {
		m.ClientUsage = *b.StreamOptions.IncludeUsage
	}
	switch {
	case b.MaxCompletionTokens != nil:
		m.OutputTokens = max(*b.MaxCompletionTokens, 0)
	case b.MaxTokens != nil:
		m.OutputTokens = max(*b.MaxTokens, 0)
	}
	var chars int
	for _, msg := range b.Messages {
		chars += len(msg.Content) + 16 // role and framing cost a few tokens
	}
	chars += len(b.Prompt) + len(b.Input)
	m.InputTokens = int64(chars+3) / 4
	if !m.Stream || m.ClientUsage {
		return m, body, nil
	}
	out, err := askForUsage(body, b.StreamOptions == nil)
	if err != nil {
		return requestMeta{}, nil, badRequest("invalid_json", "request body is not a JSON object")
	}
	return m, out, nil
}

// smallChat is a typical small chat request.
const smallChat = `{"model":"sim-small","max_tokens":64,"temperature":0.7,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"What is the capital of France?"}]}`

// largeChat is a 20-message conversation of about 8 KiB.
var largeChat = func() string {
	var b strings.Builder
	b.WriteString(`{"model":"sim-large","stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":512,"temperature":0.2,"top_p":0.9,"messages":[`)
	b.WriteString(`{"role":"system","content":"You are a careful assistant.\nAnswer in \"plain\" English."}`)
	line := "The quick brown fox jumps over the lazy dog; caf\u00e9 \\u00e9 \"quoted\" text.\n"
	for i := 1; i < 20; i++ {
		role := "user"
		if i%2 == 0 {
			role = "assistant"
		}
		b.WriteString(`,{"role":"` + role + `","content":"`)
		for range 5 {
			b.WriteString(strings.ReplaceAll(strings.ReplaceAll(line, `"`, `\"`), "\n", `\n`))
		}
		b.WriteString(`"}`)
	}
	b.WriteString(`],"tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}}}],"user":"u-1234"}`)
	return b.String()
}()

// BenchmarkParseOpenAI reads a request body with the scanner ("scan") and
// with the former whole-body decoding ("decode").
//
//	go test -run '^$' -bench BenchmarkParseOpenAI -benchmem ./proxy/
func BenchmarkParseOpenAI(b *testing.B) {
	for _, body := range []struct{ name, body string }{{"small", smallChat}, {"large", largeChat}} {
		data := []byte(body.body)
		b.Run(body.name+"/scan", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, _, err := parseOpenAI(data); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(body.name+"/decode", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, _, err := parseOpenAIReference(data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
