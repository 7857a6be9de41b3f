package proxy

import (
	"testing"

	"github.com/sluice-proxy/sluice/routing"
)

// The prompt's span (given to routing for prefix affinity) is the prompt
// member's value in the body sent on, through the edits the edge makes:
// stream_options added for usage (before or after the prompt) and the
// model alias rewritten (shorter or longer, before or after the prompt);
// and for Responses input and Messages messages.
func TestPromptSpanFollowsEdits(t *testing.T) {
	const msgs = `[{"role":"user","content":"hi \"there\""}]`
	bodies := []string{
		`{"model":"pub","messages":` + msgs + `}`,
		`{"model":"pub","stream":true,"messages":` + msgs + `}`,
		`{"messages":` + msgs + `,"stream":true,"model":"pub"}`,
		`{"stream":true,"stream_options":null,"model":"pub","messages":` + msgs + `}`,
		`{"stream":true,"messages":` + msgs + `,"stream_options":{},"model":"pub"}`,
	}
	for _, served := range []string{"a-much-longer-served-model-name", "s"} {
		route := &routing.Route{RouteConfig: routing.RouteConfig{ServedModels: map[string]string{"pub": served}}}
		for _, in := range bodies {
			m, out, err := parseOpenAI([]byte(in))
			if err != nil {
				t.Fatal(err)
			}
			if got := string(m.prompt(out)); got != msgs {
				t.Fatalf("%s: prompt span %q after the usage edit; want the messages", in, got)
			}
			x := &exchange{meta: m, body: out}
			x.applyAlias(route)
			if got := string(x.meta.prompt(x.body)); got != msgs {
				t.Errorf("%s (served %s): prompt span %q after the alias edit in %s", in, served, got, x.body)
			}
		}
	}
	for _, c := range []struct {
		d        dialect
		in, want string
	}{
		{dialectResponses, `{"model":"m","input":[{"role":"user","content":"x"}],"instructions":"be brief"}`, `[{"role":"user","content":"x"}]`},
		{dialectMessages, `{"system":"s","messages":[{"role":"user","content":"x"}],"model":"m","max_tokens":5}`, `[{"role":"user","content":"x"}]`},
		{dialectResponses, `{"model":"m"}`, ""},
	} {
		m, err := parseNative([]byte(c.in), c.d)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(m.prompt([]byte(c.in))); got != c.want {
			t.Errorf("%s: prompt %q; want %q", c.in, got, c.want)
		}
	}
}
