package gpusim

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"testing"
)

type embedOut struct {
	Object string `json:"object"`
	Model  string `json:"model"`
	Data   []struct {
		Object    string          `json:"object"`
		Index     int             `json:"index"`
		Embedding json.RawMessage `json:"embedding"`
	} `json:"data"`
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

func embedRequestJSON(t *testing.T, url, body string) embedOut {
	t.Helper()
	resp := post(t, context.Background(), url, "/v1/embeddings", body)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var out embedOut
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestEmbeddings(t *testing.T) {
	_, url := startSim(t, Config{EmbeddingDim: 8})
	out := embedRequestJSON(t, url, `{"model":"sim-small","input":["hello world!","another text"]}`)
	if out.Object != "list" || out.Model != "sim-small" || len(out.Data) != 2 {
		t.Fatalf("answer %+v", out)
	}
	if out.Usage.PromptTokens != 3+3 || out.Usage.TotalTokens != 6 {
		t.Errorf("usage %+v; want 6 prompt tokens", out.Usage)
	}
	vecs := make([][]float32, 2)
	for i, d := range out.Data {
		if d.Object != "embedding" || d.Index != i {
			t.Errorf("data[%d] = %+v", i, d)
		}
		if err := json.Unmarshal(d.Embedding, &vecs[i]); err != nil {
			t.Fatal(err)
		}
		if len(vecs[i]) != 8 || math.Abs(norm(vecs[i])-1) > 1e-5 {
			t.Errorf("vector %v: want 8 dims, unit length", vecs[i])
		}
	}
	if equal(vecs[0], vecs[1]) {
		t.Error("different inputs gave equal vectors")
	}
	// Deterministic, and base64 encodes the same floats.
	again := embedRequestJSON(t, url, `{"input":"hello world!","encoding_format":"base64"}`)
	var s string
	if err := json.Unmarshal(again.Data[0].Embedding, &s); err != nil {
		t.Fatalf("base64 embedding %s: %v", again.Data[0].Embedding, err)
	}
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(raw) != 32 {
		t.Fatalf("base64 %q: %v", s, err)
	}
	dec := make([]float32, 8)
	for i := range dec {
		dec[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	if !equal(dec, vecs[0]) {
		t.Errorf("base64 vector %v; want %v", dec, vecs[0])
	}
	tokens := embedRequestJSON(t, url, `{"input":[1,2,3,4,5]}`)
	if len(tokens.Data) != 1 || tokens.Usage.PromptTokens != 5 {
		t.Errorf("token-id input: %+v; want one vector, 5 tokens", tokens)
	}
	for _, bad := range []string{`{"input":[]}`, `{"input":7}`, `{}`, `{"input":"x","encoding_format":"hex"}`} {
		wantError(t, post(t, context.Background(), url, "/v1/embeddings", bad), 400, "invalid_value")
	}
}

func norm(v []float32) float64 {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	return math.Sqrt(s)
}

func equal(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
