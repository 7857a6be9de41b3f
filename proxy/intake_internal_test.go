package proxy

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
)

// parseOpenAIReference reads a body as a Python (pydantic) or Rust (serde)
// backend would, plus the edge's refusals, by walking json.Decoder tokens:
// names compared exactly, the last of a repeated name winning, except
// that the names the edge acts on must be spelled exactly and once. It
// returns the meta and the error code ("" for none).
func parseOpenAIReference(body []byte) (requestMeta, string) {
	if !json.Valid(body) {
		return requestMeta{}, "invalid_json"
	}
	d := json.NewDecoder(bytes.NewReader(body))
	if tok, _ := d.Token(); tok != json.Delim('{') {
		return requestMeta{}, "invalid_json"
	}
	m := requestMeta{N: 1}
	choices := map[string]int64{"n": 1, "best_of": 1} // the last of each wins
	var maxTokens, maxCompletion *int64
	var chars, prompt, input int
	seen := map[string]bool{}
	guard := func(k string, names []string) string {
		for _, g := range names {
			if strings.EqualFold(k, g) {
				switch {
				case seen[g]:
					return "duplicate_field"
				case k != g:
					return "ambiguous_field"
				}
				seen[g] = true
			}
		}
		return ""
	}
	for d.More() {
		tok, _ := d.Token()
		k := tok.(string)
		if code := guard(k, openAINames[:openAIUnique]); code != "" {
			return requestMeta{}, code
		}
		var raw json.RawMessage
		d.Decode(&raw)
		var err error
		switch k {
		case "model":
			err = json.Unmarshal(raw, &m.Model)
		case "stream":
			var b *bool
			if err = json.Unmarshal(raw, &b); b != nil {
				m.Stream = *b
			}
		case "stream_options":
			if raw[0] == 'n' {
				break
			}
			if raw[0] != '{' {
				return requestMeta{}, "invalid_type"
			}
			od := json.NewDecoder(bytes.NewReader(raw))
			od.Token()
			for od.More() {
				tok, _ := od.Token()
				var v json.RawMessage
				if code := guard(tok.(string), []string{"include_usage"}); code != "" {
					return requestMeta{}, code
				}
				od.Decode(&v)
				if tok.(string) == "include_usage" {
					var b *bool
					if err = json.Unmarshal(v, &b); err != nil {
						return requestMeta{}, "invalid_type"
					}
					m.ClientUsage = b != nil && *b
				}
			}
		case "max_tokens":
			maxTokens = nil
			err = json.Unmarshal(raw, &maxTokens)
		case "max_completion_tokens":
			maxCompletion = nil
			err = json.Unmarshal(raw, &maxCompletion)
		case "n", "best_of":
			var n *int64
			if err = json.Unmarshal(raw, &n); err == nil && n != nil {
				if *n < 1 || *n > maxChoices {
					return requestMeta{}, "invalid_value"
				}
				choices[k] = *n
			}
		case "messages":
			var msgs []json.RawMessage
			if err = json.Unmarshal(raw, &msgs); err != nil {
				break
			}
			chars = 0
			for _, msg := range msgs {
				chars += 16
				var fields map[string]json.RawMessage // exact keys, the last wins
				if err = json.Unmarshal(msg, &fields); err != nil {
					break
				}
				chars += len(fields["content"])
			}
		case "prompt":
			prompt = len(raw)
		case "input":
			input = len(raw)
		}
		if err != nil {
			return requestMeta{}, "invalid_type"
		}
	}
	switch {
	case maxCompletion != nil:
		m.OutputTokens = max(*maxCompletion, 0)
	case maxTokens != nil:
		m.OutputTokens = max(*maxTokens, 0)
	}
	m.InputTokens = int64(chars+prompt+input+3) / 4
	m.N = max(choices["n"], choices["best_of"])
	return m, ""
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

// TestParseOpenAI checks the cases where the backends' rules are easy to
// get wrong; each also agrees with parseOpenAIReference.
func TestParseOpenAI(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want requestMeta // N 0 is read as 1
		out  string      // the body sent on; "" for the same
		err  string      // the error's code; "" for none
	}{
		{name: "chat", in: smallChat, want: requestMeta{Model: "sim-small", OutputTokens: 64, InputTokens: (30 + 32 + 32 + 3) / 4}},
		{name: "stream asks for usage", in: `{"model":"m","stream":true}`,
			want: requestMeta{Model: "m", Stream: true}, out: `{"stream_options":{"include_usage":true},"model":"m","stream":true}`},
		{name: "stream with usage", in: `{"stream":true,"stream_options":{"include_usage":true}}`,
			want: requestMeta{Stream: true, ClientUsage: true}},
		{name: "stream_options null replaced", in: `{"stream":true,"stream_options":null}`,
			want: requestMeta{Stream: true}, out: `{"stream":true,"stream_options":{"include_usage":true}}`},
		{name: "empty stream_options filled", in: `{"stream":true, "stream_options":{ }}`,
			want: requestMeta{Stream: true}, out: `{"stream":true, "stream_options":{"include_usage":true }}`},
		{name: "stream_options member added", in: `{"stream":true,"stream_options":{"x":1}}`,
			want: requestMeta{Stream: true}, out: `{"stream":true,"stream_options":{"include_usage":true,"x":1}}`},
		{name: "include_usage false edited", in: `{"stream":true,"stream_options":{"x":1, "include_usage" : false }}`,
			want: requestMeta{Stream: true}, out: `{"stream":true,"stream_options":{"x":1, "include_usage" : true }}`},
		{name: "include_usage null edited", in: `{"stream":true,"stream_options":{"include_usage":null}}`,
			want: requestMeta{Stream: true}, out: `{"stream":true,"stream_options":{"include_usage":true}}`},
		{name: "empty body object", in: `{ "stream" : true }`, want: requestMeta{Stream: true},
			out: `{"stream_options":{"include_usage":true}, "stream" : true }`},
		{name: "repeated stream_options", in: `{"stream":true,"stream_options":{"include_usage":true},"stream_options":{"x":1}}`, err: "duplicate_field"},
		{name: "case-repeated stream_options", in: `{"stream":true,"stream_options":{"include_usage":false},"Stream_Options":{"include_usage":true}}`, err: "duplicate_field"},
		{name: "repeated include_usage", in: `{"stream_options":{"include_usage":true,"include_usage":null}}`, err: "duplicate_field"},
		{name: "case-repeated include_usage", in: `{"stream_options":{"include_usage":false,"INCLUDE_USAGE":true}}`, err: "duplicate_field"},
		{name: "repeated model", in: `{"model":"a","model":"b"}`, err: "duplicate_field"},
		{name: "case-repeated model", in: `{"model":"big","Model":"small"}`, err: "duplicate_field"},
		{name: "upper-case model alone", in: `{"MODEL":"small"}`, err: "ambiguous_field"},
		{name: "Kelvin max_tokens", in: `{"max_to\u212aens":3}`, err: "ambiguous_field"},
		{name: "long s stream", in: `{"ſtream":true}`, err: "ambiguous_field"},
		{name: "upper-case stream", in: `{"STREAM":true}`, err: "ambiguous_field"},
		{name: "upper-case max_tokens", in: `{"MAX_TOKENS":1}`, err: "ambiguous_field"},
		{name: "repeated n", in: `{"n":1,"n":2}`, err: "duplicate_field"},
		{name: "upper-case n", in: `{"N":4}`, err: "ambiguous_field"},
		{name: "repeated max_output_tokens", in: `{"max_output_tokens":1,"Max_Output_Tokens":2}`, err: "duplicate_field"},
		{name: "escaped names are exact", in: `{"m\u006fdel":"x","\u0073tream":false}`, want: requestMeta{Model: "x"}},
		{name: "escaped repeat", in: `{"model":"x","m\u006fdel":"y"}`, err: "duplicate_field"},
		{name: "dotless i is not i", in: `{"ınput":"xxxx","max_tokens":1}`, want: requestMeta{OutputTokens: 1}},
		{name: "other names any case", in: `{"Messages":[{"content":"abcdefgh"}],"PROMPT":"x"}`, want: requestMeta{}},
		{name: "escaped model", in: `{"model":"gpt\u002d4\t\"q\""}`, want: requestMeta{Model: "gpt-4\t\"q\""}},
		{name: "lone surrogate", in: `{"model":"a\ud800b"}`, want: requestMeta{Model: "a\ufffdb"}},
		{name: "n", in: `{"n":3}`, want: requestMeta{N: 3}},
		{name: "n null", in: `{"n":null}`, want: requestMeta{}},
		{name: "n zero", in: `{"n":0}`, err: "invalid_value"},
		{name: "n too large", in: `{"n":129}`, err: "invalid_value"},
		{name: "n largest", in: `{"n":128}`, want: requestMeta{N: 128}},
		{name: "best_of above n", in: `{"n":2,"best_of":5}`, want: requestMeta{N: 5}},
		{name: "best_of below n", in: `{"best_of":2,"n":3}`, want: requestMeta{N: 3}},
		{name: "best_of escaped", in: `{"best_\u006ff":4}`, want: requestMeta{N: 4}},
		{name: "best_of repeated", in: `{"best_of":4,"best_of":1}`, err: "duplicate_field"},
		{name: "best_of case", in: `{"Best_Of":4}`, err: "ambiguous_field"},
		{name: "best_of zero", in: `{"best_of":0}`, err: "invalid_value"},
		{name: "best_of string", in: `{"best_of":"4"}`, err: "invalid_type"},
		{name: "best_of null", in: `{"best_of":null}`, want: requestMeta{}},
		{name: "n fraction", in: `{"n":1.5}`, err: "invalid_type"},
		{name: "completion tokens win", in: `{"max_tokens":5,"max_completion_tokens":9}`, want: requestMeta{OutputTokens: 9}},
		{name: "null completion tokens", in: `{"max_completion_tokens":null,"max_tokens":5}`, want: requestMeta{OutputTokens: 5}},
		{name: "negative tokens", in: `{"max_tokens":-3}`, want: requestMeta{}},
		{name: "largest tokens", in: `{"max_tokens":9223372036854775807}`, want: requestMeta{OutputTokens: 1<<63 - 1}},
		{name: "fraction tokens", in: `{"max_tokens":1.5}`, err: "invalid_type"},
		{name: "exponent tokens", in: `{"max_tokens":1e3}`, err: "invalid_type"},
		{name: "out of range tokens", in: `{"max_completion_tokens":9223372036854775808}`, err: "invalid_type"},
		{name: "string tokens", in: `{"max_tokens":"5"}`, err: "invalid_type"},
		{name: "number model", in: `{"model":4}`, err: "invalid_type"},
		{name: "string stream", in: `{"stream":"yes"}`, err: "invalid_type"},
		{name: "array stream_options", in: `{"stream_options":[]}`, err: "invalid_type"},
		{name: "number include_usage", in: `{"stream_options":{"include_usage":1}}`, err: "invalid_type"},
		{name: "object messages", in: `{"messages":{}}`, err: "invalid_type"},
		{name: "number message", in: `{"messages":[{"content":"x"},2]}`, err: "invalid_type"},
		{name: "message contents", in: `{"messages":[{"content":"abcd"},{"content":[1,2]},{"role":"user"},{"content":null}]}`,
			want: requestMeta{InputTokens: (6 + 5 + 0 + 4 + 4*16 + 3) / 4}},
		{name: "null message", in: `{"messages":[null,{"content":"ab"}]}`, want: requestMeta{InputTokens: (16 + 16 + 4 + 3) / 4}},
		{name: "repeated content", in: `{"messages":[{"content":"abcdefgh","content":"ab"}]}`, want: requestMeta{InputTokens: (16 + 4 + 3) / 4}},
		{name: "repeated messages", in: `{"messages":[{"content":"abcdefgh"}],"messages":[{"role":"x"}]}`,
			want: requestMeta{InputTokens: (16 + 3) / 4}}, // the last wins
		{name: "prompt and input", in: `{"prompt":"abcd","input":null,"prompt":["x"]}`, want: requestMeta{InputTokens: (5 + 4 + 3) / 4}},
		{name: "spaces", in: " \r\n\t{ \"model\" :\t\"m\" , \"stream\" : false } \n", want: requestMeta{Model: "m"}},
		{name: "null body", in: ` null `, err: "invalid_json"},
		{name: "empty object", in: `{}`, want: requestMeta{}},
		{name: "array body", in: `[{"model":"m"}]`, err: "invalid_json"},
		{name: "empty body", in: ``, err: "invalid_json"},
		{name: "form body", in: `model=m&stream=true`, err: "invalid_json"},
		{name: "cut body", in: `{"model":"m","stream":true`, err: "invalid_json"},
		{name: "trailing comma", in: `{"model":"m",}`, err: "invalid_json"},
		{name: "bad escape", in: `{"x":"\q"}`, err: "invalid_json"},
		{name: "invalid after a repeat", in: `{"model":"a","model":"b",}`, err: "invalid_json"},
		{name: "two values", in: `{} {}`, err: "invalid_json"},
		{name: "deepest nesting", in: `{"x":` + strings.Repeat("[", maxJSONDepth-1) + strings.Repeat("]", maxJSONDepth-1) + `}`, want: requestMeta{}},
		{name: "too deep", in: `{"x":` + strings.Repeat("[", maxJSONDepth) + strings.Repeat("]", maxJSONDepth) + `}`, err: "invalid_json"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			checkParseOpenAI(t, []byte(c.in))
			m, out, err := parseOpenAI([]byte(c.in))
			m.modelAt, m.modelEnd = 0, 0 // checked by checkParseOpenAI
			m.promptAt, m.promptEnd = 0, 0
			if c.want.N == 0 {
				c.want.N = 1
			}
			switch {
			case c.err != "":
				if ae, ok := err.(*APIError); !ok || ae.Status != 400 || ae.Code != c.err {
					t.Fatalf("got %#v; want a 400 %s", err, c.err)
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

// checkParseOpenAI compares parseOpenAI with parseOpenAIReference: the
// same meta or error code. The body sent on for a stream is the client's
// where usage was asked for, else one the reference reads alike but for
// include_usage, and no longer than the client's plus the member added.
// It also checks that validJSON is json.Valid.
func checkParseOpenAI(t *testing.T, body []byte) {
	t.Helper()
	if got, want := validJSON(body), json.Valid(body); got != want {
		t.Errorf("%q: validJSON %v, json.Valid %v", body, got, want)
	}
	m, out, err := parseOpenAI(bytes.Clone(body))
	if err == nil {
		// The model's span, in the body sent on, is the model's string.
		if m.modelEnd > 0 {
			if got := unquote(out[m.modelAt:m.modelEnd]); got != m.Model || out[m.modelAt] != '"' {
				t.Fatalf("%q: model span %d:%d is %q; want the string %q", body, m.modelAt, m.modelEnd, out[m.modelAt:m.modelEnd], m.Model)
			}
		} else if m.modelAt != 0 || (m.Model != "" && m.modelEnd == 0) {
			t.Fatalf("%q: model %q without a span (%d:%d)", body, m.Model, m.modelAt, m.modelEnd)
		}
		m.modelAt, m.modelEnd = 0, 0
		// The prompt's span, in the body sent on, is one JSON value.
		if p := m.prompt(out); m.promptEnd > 0 && (p == nil || !json.Valid(p) || skipValue(out, m.promptAt, 1) != m.promptEnd) {
			t.Fatalf("%q: prompt span %d:%d is %q; want one JSON value", body, m.promptAt, m.promptEnd, p)
		}
		m.promptAt, m.promptEnd = 0, 0
	}
	rm, rcode := parseOpenAIReference(body)
	code := ""
	if err != nil {
		code = err.(*APIError).Code
	}
	switch {
	case code != rcode:
		t.Fatalf("%q: error %v; reference %q", body, err, rcode)
	case m != rm:
		t.Fatalf("%q: meta %+v; reference %+v", body, m, rm)
	case err != nil:
		return
	case !m.Stream || m.ClientUsage:
		if !bytes.Equal(out, body) {
			t.Fatalf("%q: sent on %q", body, out)
		}
		return
	}
	om, ocode := parseOpenAIReference(out)
	want := m
	want.ClientUsage = true
	if ocode != "" || om != want || len(out) > len(body)+len(`"stream_options":{"include_usage":true},`) {
		t.Fatalf("%q: sent on %q, read as %+v %q", body, out, om, ocode)
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
	"":               {"model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "n", "messages", "prompt", "input", "temperature"},
	"stream_options": {"include_usage", "x"},
	"message":        {"content", "role"},
}

// genKinds is the kind of value mostly written for a name: one of
// "{}[]s0b" (an object, an array of messages, a string, an integer, a bool).
var genKinds = map[string]byte{
	"": '{', "model": 's', "stream": 'b', "stream_options": '{', "include_usage": 'b',
	"max_tokens": '0', "max_completion_tokens": '0', "n": '0', "messages": '[', "message": '{',
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
				m = genMembers[""][r.IntN(10)]
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
		g.b.WriteString([]string{"0", "-0", "12", "-3", "7", "1", "128", "1.5", "1e3", "2E-1", "9223372036854775807", "9223372036854775808", "-9223372036854775809"}[r.IntN(13)])
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

// BenchmarkParseOpenAI reads a request body with the scanner ("scan") and
// with the test's reference decoder, a json.Decoder token walk ("decode").
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
				if _, code := parseOpenAIReference(data); code != "" {
					b.Fatal(code)
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
