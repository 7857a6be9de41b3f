package proxy

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
)

// parseOpenAIReference is the former parseOpenAI: the whole body decoded.
func parseOpenAIReference(body []byte) (requestMeta, []byte, error) {
	var b openAIBody
	if err := json.Unmarshal(body, &b); err != nil {
		return requestMeta{}, nil, badRequest("invalid_json", "request body is not valid JSON: "+JSONProblem(err))
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

var parseSeeds = []string{
	smallChat,
	`{"model":"sim-small","stream":true,"max_tokens":12,"messages":[{"role":"user","content":"hello there"}]}`,
	`{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:,"}}]}]}`,
	`{"model":"m","stream":true,"stream_options":{"include_usage":false,"x":1}}`,
	`{"model":"m","stream":true,"stream_options":{}}`,
	`{"model":"m","stream":true,"stream_options":null}`,
	`{"model":"text-davinci","prompt":["a","b"],"max_tokens":-5,"echo":false}`,
	`{"model":"text-embedding-3-small","input":"the food was delicious","encoding_format":"float"}`,
	`{"model":"e","input":[[1,2,3],[4]],"dimensions":256}`,
	`{"max_tokens":10,"max_completion_tokens":20,"messages":[]}`,
	`{"max_completion_tokens":null,"max_tokens":7}`,
	`{"Model":"a","MODEL":"b","model":"c","STREAM":true}`,
	`{"model":"a","model":null,"stream":true,"stream":null}`,
	`{"\u006dodel":"x","stre\u0061m":true,"ſtream_options":{"include_usage":true},"max_to\u212aens":3}`,
	`{"model":"gpt\u002d4\n\"\ud800","messages":[{"CONTENT":"a","content":"bb"},null,{"role":"user"}]}`,
	"{\"model\":\"caf\xc3\xa9\xff\"}",
	`{"stream_options":{"include_usage":true},"stream_options":{},"stream":true}`,
	`{"stream_options":{"include_usage":true},"stream_options":null,"stream_options":{},"stream":true}`,
	`{"stream_options":{"include_usage":true,"include_usage":null},"stream":true}`,
	`{"messages":[{"content":"abc"},{"content":"xyz"}],"messages":[{}]}`,
	`{"messages":[{"content":"abc"}],"messages":null,"messages":[{}]}`,
	`{"messages":[{"content":"abc"}],"messages":[],"messages":[{"content":1}]}`,
	`{"prompt":null,"input":{},"messages":[{"content":null}]}`,
	`{"model":5}`, `{"stream":"true"}`, `{"stream_options":[]}`, `{"stream_options":{"include_usage":1}}`,
	`{"max_tokens":1.5}`, `{"max_tokens":1e3}`, `{"max_tokens":-0}`, `{"max_tokens":9223372036854775808}`,
	`{"max_tokens":-9223372036854775808}`, `{"max_tokens":"5"}`, `{"messages":{}}`, `{"messages":[1]}`,
	`{"messages":["x"]}`, `{"messages":[[]]}`,
	" \t\r\n{ \"model\" : \"m\" , \"stream\" :true ,\"messages\":[ { \"content\" : \"x\" } ] } \n",
	`null`, ` null `, `[]`, `"x"`, `1`, `true`, ``, ` `, `{}`, `{"a":[{"b":{}}]}`,
	`{"model":"m","stream":true`, `{"model":"m`, `{"model":"m",}`, `{"model" "m"}`, `{"a":01}`, `{"a":1.}`,
	`{"x":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[{"a":[1,{}]}]}]}]}]}]}]}]}]}]}]}]}]}]}]}]}]}]}]}]}]}]}]}]}]}]}]}]}]}]}]}]}]}]}`,
	`{"a":"\x"}`, `{"a":"\u12"}`, "{\"a\":\"\x01\"}", `{"a":tru}`, `{"a":nul}`, `{} x`, `{}{}`, `[1,]`,
}

// TestParseOpenAI checks the cases where encoding/json's rules are easy
// to get wrong; each also agrees with parseOpenAIReference.
func TestParseOpenAI(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want requestMeta
		out  string // the body sent on; "" for the same
		err  string // in the error's message; "" for none
	}{
		{name: "chat", in: smallChat, want: requestMeta{Model: "sim-small", OutputTokens: 64, InputTokens: (30 + 32 + 32 + 3) / 4}},
		{name: "stream asks for usage", in: `{"model":"m","stream":true}`,
			want: requestMeta{Model: "m", Stream: true}, out: `{"stream_options":{"include_usage":true},"model":"m","stream":true}`},
		{name: "stream with usage", in: `{"stream":true,"stream_options":{"include_usage":true}}`,
			want: requestMeta{Stream: true, ClientUsage: true}},
		{name: "stream_options null is absent", in: `{"stream":true,"stream_options":null}`,
			want: requestMeta{Stream: true}, out: `{"stream_options":{"include_usage":true},"stream":true,"stream_options":null}`},
		{name: "stream_options re-encoded", in: `{"stream":true, "stream_options":{}}`,
			want: requestMeta{Stream: true}, out: `{"stream":true,"stream_options":{"include_usage":true}}`},
		{name: "repeated stream_options merge", in: `{"stream":true,"stream_options":{"include_usage":true},"stream_options":{"x":1}}`,
			want: requestMeta{Stream: true, ClientUsage: true}},
		{name: "stream_options null in between", in: `{"stream":true,"stream_options":{"include_usage":true},"stream_options":null,"stream_options":{}}`,
			want: requestMeta{Stream: true}, out: `{"stream":true,"stream_options":{"include_usage":true}}`},
		{name: "include_usage null", in: `{"stream_options":{"include_usage":true,"include_usage":null}}`, want: requestMeta{}},
		{name: "last name wins", in: `{"model":"a","Model":"b","MODEL":"c"}`, want: requestMeta{Model: "c"}},
		{name: "null keeps a value", in: `{"model":"a","model":null,"stream":true,"stream":null,"stream_options":{"include_usage":true}}`,
			want: requestMeta{Model: "a", Stream: true, ClientUsage: true}},
		{name: "escaped names", in: `{"m\u006fdel":"x","\u0073tream":false}`, want: requestMeta{Model: "x"}},
		{name: "Kelvin sign and long s", in: `{"max_to\u212aens":3,"ſtream":false}`, want: requestMeta{OutputTokens: 3}},
		{name: "dotless i is not i", in: `{"ınput":"xxxx","max_tokens":1}`, want: requestMeta{OutputTokens: 1}},
		{name: "escaped model", in: `{"model":"gpt\u002d4\t\"q\""}`, want: requestMeta{Model: "gpt-4\t\"q\""}},
		{name: "lone surrogate", in: `{"model":"a\ud800b"}`, want: requestMeta{Model: "a\ufffdb"}},
		{name: "invalid UTF-8 model", in: "{\"model\":\"a\xffb\"}", want: requestMeta{Model: "a\ufffdb"}},
		{name: "completion tokens win", in: `{"max_tokens":5,"max_completion_tokens":9}`, want: requestMeta{OutputTokens: 9}},
		{name: "null completion tokens", in: `{"max_completion_tokens":9,"max_tokens":5,"max_completion_tokens":null}`, want: requestMeta{OutputTokens: 5}},
		{name: "negative tokens", in: `{"max_tokens":-3}`, want: requestMeta{}},
		{name: "minus zero", in: `{"max_tokens":-0}`, want: requestMeta{}},
		{name: "largest tokens", in: `{"max_tokens":9223372036854775807}`, want: requestMeta{OutputTokens: 1<<63 - 1}},
		{name: "fraction tokens", in: `{"max_tokens":1.5}`, err: "max_tokens"},
		{name: "exponent tokens", in: `{"max_tokens":1e3}`, err: "max_tokens"},
		{name: "out of range tokens", in: `{"max_completion_tokens":9223372036854775808}`, err: "max_completion_tokens"},
		{name: "string tokens", in: `{"max_tokens":"5"}`, err: "max_tokens"},
		{name: "number model", in: `{"model":4}`, err: "model"},
		{name: "string stream", in: `{"stream":"yes"}`, err: "stream"},
		{name: "array stream_options", in: `{"stream_options":[]}`, err: "stream_options"},
		{name: "number include_usage", in: `{"stream_options":{"include_usage":1}}`, err: "include_usage"},
		{name: "object messages", in: `{"messages":{}}`, err: "messages"},
		{name: "number message", in: `{"messages":[{"content":"x"},2]}`, err: "messages"},
		{name: "message contents", in: `{"messages":[{"content":"abcd"},{"content":[1,2]},{"role":"user"},{"content":null}]}`,
			want: requestMeta{InputTokens: (6 + 5 + 0 + 4 + 4*16 + 3) / 4}},
		{name: "null message", in: `{"messages":[null,{"content":"ab"}]}`, want: requestMeta{InputTokens: (16 + 16 + 4 + 3) / 4}},
		{name: "repeated content", in: `{"messages":[{"content":"abcdefgh","Content":"ab"}]}`, want: requestMeta{InputTokens: (16 + 4 + 3) / 4}},
		{name: "repeated messages", in: `{"messages":[{"content":"abcdefgh"}],"messages":[{"role":"x"}]}`,
			want: requestMeta{InputTokens: (16 + 10 + 3) / 4}}, // encoding/json keeps the first content
		{name: "messages emptied", in: `{"messages":[{"content":"abcdefgh"}],"messages":[],"messages":[{}]}`,
			want: requestMeta{InputTokens: (16 + 3) / 4}},
		{name: "prompt and input", in: `{"prompt":"abcd","input":null,"prompt":["x"]}`, want: requestMeta{InputTokens: (5 + 4 + 3) / 4}},
		{name: "spaces", in: " \r\n\t{ \"model\" :\t\"m\" , \"stream\" : false } \n", want: requestMeta{Model: "m"}},
		{name: "null body", in: ` null `, want: requestMeta{}},
		{name: "empty object", in: `{}`, want: requestMeta{}},
		{name: "array body", in: `[{"model":"m"}]`, err: "wrong type (array)"},
		{name: "string body", in: `"m"`, err: "wrong type (string)"},
		{name: "number body", in: `7`, err: "wrong type (number)"},
		{name: "empty body", in: ``, err: "unexpected end of JSON input"},
		{name: "cut body", in: `{"model":"m","stream":true`, err: "unexpected end of JSON input"},
		{name: "trailing comma", in: `{"model":"m",}`, err: "(at byte 14)"},
		{name: "bad escape", in: `{"x":"\q"}`, err: "invalid character 'q' in string escape code"},
		{name: "control character", in: "{\"x\":\"\n\"}", err: "invalid character '\\n' in string literal"},
		{name: "leading zero", in: `{"x":01}`, err: "after object key:value pair"},
		{name: "two values", in: `{} {}`, err: "after top-level value"},
		{name: "deepest nesting", in: `{"x":` + strings.Repeat("[", maxJSONDepth-1) + strings.Repeat("]", maxJSONDepth-1) + `}`, want: requestMeta{}},
		{name: "too deep", in: `{"x":` + strings.Repeat("[", maxJSONDepth) + strings.Repeat("]", maxJSONDepth) + `}`, err: "exceeded max depth"},
		{name: "deep mixed nesting", in: `{"x":` + strings.Repeat(`[{"a":`, 70) + `1` + strings.Repeat(`}]`, 70) + `}`, want: requestMeta{}},
		{name: "deep mismatched nesting", in: `{"x":` + strings.Repeat(`[{"a":`, 70) + `1` + strings.Repeat(`]}`, 70) + `}`, err: "invalid character"},
		{name: "too deep content", in: `{"messages":[{"content":` + strings.Repeat("[", maxJSONDepth-2) + strings.Repeat("]", maxJSONDepth-2) + `}]}`, err: "exceeded max depth"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			checkParseOpenAI(t, []byte(c.in))
			m, out, err := parseOpenAI([]byte(c.in))
			switch {
			case c.err != "":
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("got error %v; want one with %q", err, c.err)
				}
				if ae, ok := err.(*APIError); !ok || ae.Status != 400 || ae.Code != "invalid_json" {
					t.Fatalf("got %#v; want a 400 invalid_json", err)
				}
			case err != nil:
				t.Fatalf("got error %v", err)
			case m != c.want:
				t.Fatalf("got %+v; want %+v", m, c.want)
			case c.out == "" && string(out) != c.in, c.out != "" && string(out) != c.out:
				t.Fatalf("sent on %s", out)
			}
		})
	}
}

func FuzzParseOpenAI(f *testing.F) {
	for _, s := range parseSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { checkParseOpenAI(t, []byte(s)) })
}

// checkParseOpenAI compares parseOpenAI with the whole-body decoding: the
// same meta, body sent on and error (message included). It also checks
// that validJSON is json.Valid and that the scan leaves to encoding/json
// only what it must.
func checkParseOpenAI(t *testing.T, body []byte) {
	t.Helper()
	if got, want := validJSON(body), json.Valid(body); got != want {
		t.Errorf("%q: validJSON %v, json.Valid %v", body, got, want)
	}
	m, out, err := parseOpenAI(bytes.Clone(body))
	rm, rout, rerr := parseOpenAIReference(body)
	switch {
	case (err == nil) != (rerr == nil):
		t.Fatalf("%q: error %v; reference %v", body, err, rerr)
	case err != nil && *err.(*APIError) != *rerr.(*APIError):
		t.Fatalf("%q: error %#v; reference %#v", body, err, rerr)
	case m != rm:
		t.Fatalf("%q: meta %+v; reference %+v", body, m, rm)
	case !bytes.Equal(out, rout):
		t.Fatalf("%q: sent on %q; reference %q", body, out, rout)
	}
	var fields openAIFields
	if !fields.scan(body) && rerr == nil && arraysNamedMessages(body) < 2 {
		t.Fatalf("%q: the scan gave up on a body encoding/json decodes", body)
	}
}

// TestParseOpenAIGenerated runs checkParseOpenAI on bodies built from
// the names parseOpenAI reads, spelled in the ways encoding/json matches,
// and values of every type: the mixes of repeats, nulls and wrong types a
// byte-mutating fuzzer seldom builds.
func TestParseOpenAIGenerated(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		var g bodyGen
		g.r = r
		g.value(0, "")
		body := g.b.Bytes()
		if r.IntN(20) == 0 { // cut or spoilt
			body = body[:r.IntN(len(body)+1)]
			if len(body) > 0 && r.IntN(2) == 0 {
				body[r.IntN(len(body))] = "{}[],:\"\\ 0an"[r.IntN(12)]
			}
		}
		checkParseOpenAI(t, body)
		if t.Failed() {
			return
		}
	}
}

type bodyGen struct {
	r *rand.Rand
	b bytes.Buffer
}

// genMembers are the names written in an object by what holds it.
var genMembers = map[string][]string{
	"":               {"model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "messages", "prompt", "input", "temperature"},
	"stream_options": {"include_usage", "x"},
	"message":        {"content", "role"},
}

// genKinds is the kind of value mostly written for a name: one of
// "{}[]s0b" (an object, an array of messages, a string, an integer, a bool).
var genKinds = map[string]byte{
	"": '{', "model": 's', "stream": 'b', "stream_options": '{', "include_usage": 'b',
	"max_tokens": '0', "max_completion_tokens": '0', "messages": '[', "message": '{',
}

// value writes the value of a member named name ("" for the body,
// "message" for an element of messages): mostly of the kind encoding/json
// takes for it, sometimes null or another kind.
func (g *bodyGen) value(depth int, name string) {
	r := g.r
	g.space()
	kind, ok := genKinds[name]
	if !ok || r.IntN(6) == 0 {
		kind = "{[s0bn"[r.IntN(6)]
	}
	if depth > 4 && (kind == '{' || kind == '[') {
		kind = 'n'
	}
	switch kind {
	case '{':
		members := genMembers[name]
		if members == nil {
			members = genMembers[""]
		}
		g.b.WriteByte('{')
		for i := range r.IntN(7) {
			if i > 0 {
				g.b.WriteByte(',')
			}
			g.space()
			m := members[r.IntN(len(members))]
			if r.IntN(10) == 0 {
				m = genMembers[""][r.IntN(9)]
			}
			g.name(m)
			g.space()
			g.b.WriteByte(':')
			if name != "" && m != "include_usage" {
				m = "x" // the pipeline reads only the body's other members
			}
			g.value(depth+1, m)
		}
		g.space()
		g.b.WriteByte('}')
	case '[':
		elem := "x"
		if name == "messages" {
			elem = "message"
		}
		g.b.WriteByte('[')
		for i := range r.IntN(4) {
			if i > 0 {
				g.b.WriteByte(',')
			}
			g.value(depth+1, elem)
		}
		g.b.WriteByte(']')
	case 's':
		g.b.WriteString([]string{`"m"`, `"gpt\u002d4"`, `"caf\u00e9 \ud83d\ude00"`, "\"a\xffb\"", `"\"\\\/\b\f\n\r\t"`, `""`, `"\ud800"`}[r.IntN(7)])
	case '0':
		g.b.WriteString([]string{"0", "-0", "12", "-3", "7", "1.5", "1e3", "2E-1", "9223372036854775807", "9223372036854775808", "-9223372036854775809"}[r.IntN(11)])
	case 'b':
		g.b.WriteString([]string{"true", "false"}[r.IntN(2)])
	default:
		g.b.WriteString("null")
	}
	g.space()
}

// name writes a member name as encoding/json would match it to name:
// in another case, with the Kelvin sign for k or long s for s, or escaped.
func (g *bodyGen) name(name string) {
	r := g.r
	var b strings.Builder
	for _, c := range name {
		switch {
		case r.IntN(12) == 0 && (c == 'k' || c == 's'):
			b.WriteString(map[rune]string{'k': "\u212a", 's': "ſ"}[c])
		case r.IntN(12) == 0:
			b.WriteString(strings.ToUpper(string(c)))
		case r.IntN(20) == 0:
			b.WriteString(`\u00` + strings.ToUpper(string("0123456789abcdef"[c>>4])) + string("0123456789abcdef"[c&15]))
		default:
			b.WriteRune(c)
		}
	}
	if r.IntN(40) == 0 {
		b.WriteString("x") // another name
	}
	g.b.WriteString(`"` + b.String() + `"`)
}

func (g *bodyGen) space() {
	if g.r.IntN(4) == 0 {
		g.b.WriteString([]string{" ", "\n", "\t", "\r\n  "}[g.r.IntN(4)])
	}
}

// arraysNamedMessages counts the top-level members of a valid JSON object
// that encoding/json decodes as "messages" and whose value is an array.
func arraysNamedMessages(body []byte) int {
	d := json.NewDecoder(bytes.NewReader(body))
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		return 0
	}
	n := 0
	for d.More() {
		key, err := d.Token()
		var v json.RawMessage
		if err != nil || d.Decode(&v) != nil {
			return n
		}
		if strings.EqualFold(key.(string), "messages") && v[0] == '[' {
			n++
		}
	}
	return n
}

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

// validJSON is skipValue over a whole body; checked against json.Valid, it
// tests the validation the scan does on the way.
func validJSON(data []byte) bool {
	i := skipSpace(data, 0)
	if i >= len(data) {
		return false
	}
	end := skipValue(data, i, 0)
	return end > 0 && skipSpace(data, end) == len(data)
}
