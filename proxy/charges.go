package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/sluice-proxy/sluice/limiter"
)

// Output-cap fields of the request bodies the edge meters: Chat
// Completions' max_completion_tokens and max_tokens (legacy Completions
// and Anthropic Messages use max_tokens too), the Responses API's
// max_output_tokens.
var capFields = [...]string{"max_completion_tokens", "max_tokens", "max_output_tokens"}

// capKeys are capFields as quoted JSON keys.
var capKeys = [...][]byte{[]byte(`"max_completion_tokens"`), []byte(`"max_tokens"`), []byte(`"max_output_tokens"`)}

// maxTokensCeiling applies the tenant's max_tokens ceiling (limits for the
// request's model, else the node's proxy max_tokens) to the request: over
// it, refused (400 max_tokens_too_large) or clamped per the policy; when
// the request names no output cap, the ceiling is added to its body so the
// backend cannot generate more than was reserved. It returns the error to
// answer, or nil with x.meta.OutputTokens and x.body updated.
func (x *exchange) maxTokensCeiling(l limiter.Limits) error {
	ceiling := l.MaxTokens
	if ceiling <= 0 {
		ceiling = x.st.Config.MaxTokens
	}
	if ceiling <= 0 || !x.parsed {
		return nil
	}
	if x.meta.OutputTokens > 0 && x.meta.OutputTokens <= ceiling && capFieldsIn(x.body) <= 1 {
		return nil
	}
	if x.meta.OutputTokens > ceiling && l.MaxTokensPolicy != limiter.MaxTokensClamp {
		return &APIError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "max_tokens_too_large",
			Message: "the requested output cap " + strconv.FormatInt(x.meta.OutputTokens, 10) +
				" exceeds this key's max_tokens limit of " + strconv.FormatInt(ceiling, 10)}
	}
	body, err := capOutput(x.body, x.r.URL.Path, ceiling)
	if err != nil {
		return badRequest("invalid_json", "request body is not a JSON object")
	}
	x.body, x.meta.OutputTokens = body, ceiling
	return nil
}

// capFieldsIn counts the output-cap fields body may name. With more than
// one, engines disagree on which wins (vLLM prefers max_completion_tokens,
// TGI reads max_tokens), so each is brought under the ceiling.
func capFieldsIn(body []byte) int {
	n := 0
	for _, k := range capKeys {
		if bytes.Contains(body, k) {
			n++
		}
	}
	if bytes.Contains(body, []byte(`\u`)) {
		n++ // an escaped key could hide one
	}
	return n
}

// capOutput lowers every output-cap field of body above ceiling to it, or,
// when the body has none, adds the one the path's API reads
// (max_output_tokens on a Responses path, else max_tokens, which vLLM,
// SGLang and TGI all accept on chat and legacy completions).
func capOutput(body []byte, path string, ceiling int64) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		return nil, err
	}
	if obj == nil {
		return nil, errors.New("not an object")
	}
	c := json.RawMessage(strconv.FormatInt(ceiling, 10))
	found := false
	for _, f := range capFields {
		raw, ok := obj[f]
		if !ok || string(raw) == "null" {
			continue
		}
		found = true
		// 0 or junk is no cap to some engines (vLLM reads
		// max_completion_tokens or max_tokens): the ceiling replaces it.
		if v, err := strconv.ParseInt(string(raw), 10, 64); err != nil || v > ceiling || v <= 0 {
			obj[f] = c
		}
	}
	if !found {
		f := "max_tokens"
		if strings.HasSuffix(path, "/responses") {
			f = "max_output_tokens"
		}
		obj[f] = c
	}
	return json.Marshal(obj)
}

// tooLargeForLimit answers a request whose reservation can never fit the tenant's
// burst: a 413 that says so, not a 429 that invites retrying forever.
func tooLargeForLimit(o *limiter.TooLarge) *APIError {
	return &APIError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
		Code: "request_too_large_for_limit",
		Message: "this request reserves " + strconv.FormatInt(o.Need, 10) + " " + strings.ReplaceAll(o.Reason, "_", " ") +
			" (input + max_tokens × n) but the key's " + o.Reason + " limit holds at most " +
			strconv.FormatInt(o.Burst, 10) + " at once; lower max_tokens or n, or shorten the prompt"}
}

// sentBody marks its flag once the transport has read the body to its end:
// the whole request was handed to the backend's connection. The flag lives
// in the first sentBody (not in the leg): the transport may still be
// reading an abandoned attempt's body while the leg's storage is reused by
// the next attempt.
type sentBody struct {
	io.ReadCloser
	sent *atomic.Bool
	flag atomic.Bool // the first body's: shared with the rewound ones
}

func (b *sentBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.sent.Store(true)
	}
	return n, err
}

// watchSent makes req mark l.sent when its body has been written, also
// when the transport rewinds it (GetBody) to retry on a new connection.
func (l *leg) watchSent(req *http.Request) {
	if req.Body == nil || req.Body == http.NoBody {
		return
	}
	if rb, ok := req.Body.(*replayBody); ok {
		rb.sent = &rb.flag // marked by the body itself, rewound or not: no wrapper
		l.sent = rb.sent
		return
	}
	first := &sentBody{ReadCloser: req.Body}
	first.sent = &first.flag
	l.sent = first.sent
	req.Body = first
	if gb := req.GetBody; gb != nil {
		req.GetBody = func() (io.ReadCloser, error) {
			rc, err := gb()
			if err != nil {
				return nil, err
			}
			return &sentBody{ReadCloser: rc, sent: first.sent}, nil
		}
	}
}

// accepted reports whether the backend accepted the leg's request, so that
// it started (or finished) the prefill: the whole request was written and
// the backend did not answer with an error status. A leg cancelled by the
// client, the first-token timeout or a lost hedge after that point was
// accepted. (Response headers alone would not do: vLLM sends a streamed
// answer's 200 as soon as the request is validated, but a non-streamed
// one's only with the whole completion.)
func (l *leg) accepted() bool {
	return l.sent != nil && l.sent.Load() && (l.resp == nil || l.resp.StatusCode < 400)
}
