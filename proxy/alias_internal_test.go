package proxy

import (
	"bytes"
	"strings"
	"testing"
)

const testServed = "meta-llama/Llama-3.1-8B-Instruct"

func TestAliasRestoreEvent(t *testing.T) {
	a := newAlias("gpt-small", testServed)
	cases := []struct{ in, want string }{
		// chat chunk
		{`data: {"id":"c","object":"chat.completion.chunk","model":"` + testServed + `","choices":[]}` + "\n\n",
			`data: {"id":"c","object":"chat.completion.chunk","model":"gpt-small","choices":[]}` + "\n\n"},
		// Responses: response.model, nested
		{"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\", \"model\" : \"" + testServed + "\"}}\n\n",
			"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\", \"model\" : \"gpt-small\"}}\n\n"},
		// Messages: message_start.message.model, first member
		{`data: {"type":"message_start","message":{"model":"` + testServed + `","id":"m"}}` + "\n\n",
			`data: {"type":"message_start","message":{"model":"gpt-small","id":"m"}}` + "\n\n"},
		// the name in text, or as another member's value, stays
		{`data: {"choices":[{"delta":{"content":"\"model\":\"` + testServed + `\""}}],"served":"` + testServed + `"}` + "\n\n", ""},
		{`data: {"xmodel":"` + testServed + `"}` + "\n\n", ""},
		{`data: {"model":"` + testServed + `-v2"}` + "\n\n", ""},
		{`data: {"model":"x` + testServed + `"}` + "\n\n", ""},
		// no name at all
		{`data: {"model":"other"}` + "\n\n", ""},
		// two members
		{`{"model":"` + testServed + `","x":{"model":"` + testServed + `"}}`, `{"model":"gpt-small","x":{"model":"gpt-small"}}`},
	}
	for _, c := range cases {
		want := c.want
		if want == "" {
			want = c.in
		}
		in := []byte(c.in)
		got := a.restore(in)
		if string(got) != want {
			t.Errorf("restore(%s)\n got %s\nwant %s", c.in, got, want)
		}
		if c.want == "" && &got[0] != &in[0] {
			t.Errorf("restore(%s) copied an event it did not change", c.in)
		}
		if got := a.restoreBody([]byte(c.in)); string(got) != want {
			t.Errorf("restoreBody(%s) = %s", c.in, got)
		}
	}
	var none *alias
	if ev := []byte(`{"model":"` + testServed + `"}`); &none.restore(ev)[0] != &ev[0] || &none.restoreBody(ev)[0] != &ev[0] {
		t.Error("a nil alias changed an event")
	}
}

// The writer restores a non-streamed body whatever the writes cut it
// into: every split into two writes, and into one-byte writes.
func TestAliasRestoreWriterSplitAnywhere(t *testing.T) {
	a := newAlias("gpt-small", testServed)
	body := `{"id":"x","object":"chat.completion","model"   :  "` + testServed + `","choices":[{"message":{"content":"` +
		strings.Repeat("y", 100) + `\"model\":\"` + testServed + `\""}}],"usage":{},"x":{"model":"` + testServed + `"}}`
	want := string(a.restoreBody([]byte(body)))
	if strings.Count(want, `"gpt-small"`) != 2 || strings.Count(want, testServed) != 1 {
		t.Fatalf("restoreBody: %s", want)
	}
	for cut := 0; cut <= len(body); cut++ {
		var out bytes.Buffer
		w := newRestoreWriter(a, &out)
		for _, p := range []string{body[:cut], body[cut:]} {
			if n, err := w.Write([]byte(p)); n != len(p) || err != nil {
				t.Fatalf("cut %d: Write %d %v", cut, n, err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if out.String() != want {
			t.Fatalf("cut at %d:\n got %s\nwant %s", cut, out.String(), want)
		}
	}
	var out bytes.Buffer
	w := newRestoreWriter(a, &out)
	for i := 0; i < len(body); i++ {
		w.Write([]byte{body[i]})
		if held := len(w.buf) - w.keep; held >= len(a.servedQ) {
			t.Fatalf("after byte %d the writer holds back %d bytes; want fewer than %d", i, held, len(a.servedQ))
		}
	}
	w.Close()
	if out.String() != want {
		t.Fatalf("one byte a write:\n got %s\nwant %s", out.String(), want)
	}
	// A nil alias writes through.
	out.Reset()
	nw := newRestoreWriter(nil, &out)
	nw.Write([]byte(body))
	nw.Close()
	if out.String() != body {
		t.Fatal("a nil alias changed the body")
	}
}

func FuzzAliasRestoreWriter(f *testing.F) {
	f.Add(`{"model":"`+testServed+`"}`, 5, 3)
	f.Add(`{"a":"\"model\":\"`+testServed+`\"", "model" :"`+testServed+`"}`, 20, 1)
	f.Fuzz(func(t *testing.T, body string, cut1, cut2 int) {
		a := newAlias("gpt-small", testServed)
		want := string(a.restoreBody([]byte(body)))
		c1 := min(max(cut1, 0), len(body))
		c2 := min(max(cut2, 0), len(body)-c1)
		var out bytes.Buffer
		w := newRestoreWriter(a, &out)
		w.Write([]byte(body[:c1]))
		w.Write([]byte(body[c1 : c1+c2]))
		w.Write([]byte(body[c1+c2:]))
		w.Close()
		// The writer looks back maxLookBehind bytes: it agrees with
		// restoreBody unless whitespace around a key is longer.
		if out.String() != want && !strings.Contains(body, strings.Repeat(" ", 16)) {
			t.Fatalf("%q cut %d,%d:\n got %s\nwant %s", body, c1, c2, out.String(), want)
		}
	})
}

// BenchmarkAliasRestore is the per-event cost of the restore hook: a
// request without an alias (nil), and an aliased one whose events do and
// do not name the served model.
func BenchmarkAliasRestore(b *testing.B) {
	chunk := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"` + testServed +
		`","choices":[{"index":0,"delta":{"content":"hello"},"finish_reason":null}]}` + "\n\n")
	other := bytes.Replace(chunk, []byte(testServed), []byte("sim-small"), 1)
	b.Run("none", func(b *testing.B) {
		var a *alias
		b.ReportAllocs()
		for b.Loop() {
			a.restore(chunk)
		}
	})
	b.Run("aliased-miss", func(b *testing.B) {
		a := newAlias("gpt-small", testServed)
		b.ReportAllocs()
		for b.Loop() {
			a.restore(other)
		}
	})
	b.Run("aliased-hit", func(b *testing.B) {
		a := newAlias("gpt-small", testServed)
		b.ReportAllocs()
		for b.Loop() {
			a.restore(chunk)
		}
	})
}

// Responses and Messages bodies: the model's span, and n and best_of read
// as parseOpenAI reads them (choicesOf used to decode every dialect's
// body for them).
func TestParseNativeSpanAndChoices(t *testing.T) {
	cases := []struct {
		d     dialect
		in    string
		model string
		n     int64
		err   string
	}{
		{dialectResponses, `{"input":"x", "model" : "gpt\u002dsmall","n":3}`, "gpt-small", 3, ""},
		{dialectMessages, `{"model":"m","best_of":4,"n":2,"messages":[]}`, "m", 4, ""},
		{dialectMessages, `{"model":"m","N":4}`, "", 0, "duplicate_field"},
		{dialectResponses, `{"model":"m","best_of":0}`, "", 0, "invalid_value"},
		{dialectResponses, `{"model":"m"}`, "m", 1, ""},
	}
	for _, c := range cases {
		m, err := parseNative([]byte(c.in), c.d)
		if c.err != "" {
			if ae, ok := err.(*APIError); !ok || ae.Code != c.err {
				t.Errorf("%s: got %v; want %s", c.in, err, c.err)
			}
			continue
		}
		if err != nil || m.Model != c.model || m.N != c.n || unquote([]byte(c.in[m.modelAt:m.modelEnd])) != c.model {
			t.Errorf("%s: got %+v %v; want model %q n %d", c.in, m, err, c.model, c.n)
		}
	}
}
