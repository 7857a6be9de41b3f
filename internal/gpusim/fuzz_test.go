package gpusim

import (
	"net/http/httptest"
	"strings"
	"testing"
)

func FuzzParseGenerate(f *testing.F) {
	for _, seed := range []string{
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url"}]}]}`,
		`{"prompt":["a","b"],"max_completion_tokens":2,"stop":["the","a"]}`,
		`{"prompt":[[1,2],[3]],"stop":"x","stream_options":{"include_usage":true}}`,
		`{"prompt":[1,2,3],"n":1,"model":"sim-small"}`,
		`{"prompt":null}`, `{"messages":null}`, `[]`, `nul`, `{"max_tokens":-1}`,
	} {
		f.Add(seed, true)
		f.Add(seed, false)
	}
	s := New(Config{KVCacheTokens: 4096})
	defer s.Close()
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		req := httptest.NewRequest("POST", "/v1/completions", strings.NewReader(body))
		a := apiCompletion
		if chat {
			a = apiChat
		}
		j, e := s.parseGenerate(httptest.NewRecorder(), req, a)
		if (j == nil) == (e == nil) {
			t.Fatalf("job %v and error %v", j, e)
		}
		if e != nil {
			if e.status < 400 || e.status > 499 || e.message == "" || e.code == "" {
				t.Fatalf("error %+v", e)
			}
			return
		}
		if j.prompt < 1 || j.limit < 0 || j.prompt+j.limit > 4096 || (j.finish != "stop" && j.finish != "length") {
			t.Fatalf("job %+v", j)
		}
	})
}

func FuzzEmbedInputs(f *testing.F) {
	for _, seed := range []string{`"x"`, `["a","b"]`, `[1,2]`, `[[1],[2,3]]`, `[]`, `[[]]`, `[1,"a"]`, `{}`, ``} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		texts, tokens, e := embedInputs([]byte(raw))
		if e == nil && (len(texts) == 0 || tokens < len(texts)) {
			t.Fatalf("%d inputs, %d tokens", len(texts), tokens)
		}
	})
}
