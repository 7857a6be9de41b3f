package configs

import (
	"reflect"
	"strings"
	"testing"
)

// A route's served_models decode into routing's half of the route.
func TestServedModelsDecode(t *testing.T) {
	y := valid + `  - path: /v1/chat/
    models: [gpt-small, gpt-big]
    served_models:
      gpt-small: meta-llama/Llama-3.1-8B-Instruct
    pool: p
`
	c, err := Parse("a.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"gpt-small": "meta-llama/Llama-3.1-8B-Instruct"}
	if got := c.Routes[1].ServedModels; !reflect.DeepEqual(got, want) {
		t.Fatalf("served_models %v; want %v", got, want)
	}
}

// Each wrong alias is refused with its own message, at its route.
func TestServedModelsErrors(t *testing.T) {
	cases := []struct {
		name, routes, want string
	}{
		{"not a public name", `  - path: /v1/chat/
    models: [a]
    served_models: {b: served-b}
    pool: p
`, `routes[1].served_models: "b" is not one of the route's models`},
		{"empty served name", `  - path: /v1/chat/
    models: [a]
    served_models: {a: ""}
    pool: p
`, `routes[1].served_models: "a" maps to an empty served name`},
		{"maps to itself", `  - path: /v1/chat/
    models: [a]
    served_models: {a: a}
    pool: p
`, `routes[1].served_models: "a" maps to itself`},
		{"empty model name", `  - path: /v1/chat/
    models: [a, ""]
    pool: p
`, `routes[1].models[1]: empty model name`},
		{"not openai", `  - path: /events/
    kind: sse
    models: [a]
    served_models: {a: served-a}
    pool: p
`, `routes[1]: served_models needs kind openai`},
		{"collides with another route", `  - path: /v1/
    models: [gpt-small]
    served_models: {gpt-small: llama-8b}
    pool: p
  - path: /v1/chat/
    models: [gpt-small]
    pool: p
`, `routes[2]: model "gpt-small" is an alias of routes[1] (served as "llama-8b")`},
		{"two aliases of one name", `  - path: /v1/chat/
    models: [gpt-small]
    served_models: {gpt-small: llama-8b}
    pool: p
  - path: /v1/
    models: [gpt-small]
    served_models: {gpt-small: qwen-7b}
    pool: p
`, `routes[2]: model "gpt-small" is an alias of routes[1] (served as "llama-8b")`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("a.yaml", []byte(valid+tc.routes))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v; want an error containing %q", err, tc.want)
			}
			if n := len(Errors(err)); n != 1 {
				t.Fatalf("got %d errors; want 1: %v", n, err)
			}
		})
	}
	// Other hosts, or paths that cannot match the same requests, may use
	// the name for another model.
	ok := valid + `  - path: /v1/chat/
    models: [gpt-small]
    served_models: {gpt-small: llama-8b}
    pool: p
  - path: /v2/
    models: [gpt-small]
    pool: p
  - host: other.example
    path: /v1/
    models: [gpt-small]
    served_models: {gpt-small: qwen-7b}
    pool: p
`
	if _, err := Parse("a.yaml", []byte(ok)); err != nil {
		t.Fatalf("separate hosts and paths: %v", err)
	}
}
