package gpusim

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"time"
)

type embedRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format"`
}

type embeddingOut struct {
	Object    string `json:"object"`
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"` // []float32, or a base64 string
}

type embedResponse struct {
	Object string         `json:"object"`
	Data   []embeddingOut `json:"data"`
	Model  string         `json:"model"`
	Usage  struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

// serveEmbeddings answers /v1/embeddings with one deterministic unit vector
// per input (a function of Seed and the input text), at once: embeddings
// do not go through the decode batch.
func (s *Sim) serveEmbeddings(w http.ResponseWriter, r *http.Request) {
	s.total.Add(1)
	var req embedRequest
	if e := readJSON(w, r, &req); e != nil {
		s.writeError(w, e)
		return
	}
	if req.Model != "" && req.Model != s.cfg.Model {
		s.writeError(w, errUnknownModel(req.Model))
		return
	}
	if req.EncodingFormat != "" && req.EncodingFormat != "float" && req.EncodingFormat != "base64" {
		s.writeError(w, badRequest("invalid_value", "encoding_format must be float or base64"))
		return
	}
	inputs, tokens, e := embedInputs(req.Input)
	if e != nil {
		s.writeError(w, e)
		return
	}
	out := embedResponse{Object: "list", Model: s.cfg.Model}
	for i, text := range inputs {
		v := s.embed(text)
		var emb any = v
		if req.EncodingFormat == "base64" {
			emb = encodeBase64(v)
		}
		out.Data = append(out.Data, embeddingOut{Object: "embedding", Index: i, Embedding: emb})
	}
	out.Usage.PromptTokens, out.Usage.TotalTokens = tokens, tokens
	s.metrics.promptTokens.Add(float64(tokens))
	s.writeJSON(w, out)
	s.completed.Add(1)
}

// embedInputs reads "input": a string, an array of strings, an array of
// token ids or an array of such arrays.
func embedInputs(raw json.RawMessage) ([]string, int, *apiError) {
	raw = bytes.TrimSpace(raw)
	var ids []int
	if len(raw) == 0 || raw[0] != '[' || json.Unmarshal(raw, &ids) == nil {
		text, n, e := completionPrompt(raw) // a string or one array of token ids
		if e != nil {
			return nil, 0, badRequest("invalid_value", "input must be a string or an array")
		}
		return []string{text}, n, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || len(items) == 0 {
		return nil, 0, badRequest("invalid_value", "input must be a non-empty array of strings or token arrays")
	}
	texts := make([]string, 0, len(items))
	tokens := 0
	for _, it := range items {
		text, n, e := completionPrompt(it)
		if e != nil {
			return nil, 0, e
		}
		texts, tokens = append(texts, text), tokens+n
	}
	return texts, tokens, nil
}

// embed returns the unit vector of text.
func (s *Sim) embed(text string) []float32 {
	seed := textSeed(s.cfg.Seed, "embed", text)
	v := make([]float32, s.cfg.EmbeddingDim)
	var norm float64
	for i := range v {
		x := float64(splitmix64(seed+uint64(i)*0x9e3779b97f4a7c15)>>11)/(1<<53)*2 - 1
		v[i] = float32(x)
		norm += x * x
	}
	norm = math.Sqrt(norm)
	for i := range v {
		v[i] = float32(float64(v[i]) / norm)
	}
	return v
}

// encodeBase64 is OpenAI's base64 encoding: little-endian float32s.
func encodeBase64(v []float32) string {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return base64.StdEncoding.EncodeToString(b)
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelInfo `json:"data"`
}

type modelInfo struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// serveModels answers /v1/models with the one model served.
func (s *Sim) serveModels(w http.ResponseWriter, _ *http.Request) {
	s.writeJSON(w, modelList{Object: "list", Data: []modelInfo{{
		ID: s.cfg.Model, Object: "model", Created: time.Now().Unix(), OwnedBy: "sluice-sim",
	}}})
}

// writeJSON answers 200 with v as JSON.
func (s *Sim) writeJSON(w http.ResponseWriter, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		s.writeError(w, &apiError{http.StatusInternalServerError, "encoding the response: " + err.Error(),
			"server_error", "internal_error"})
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}
