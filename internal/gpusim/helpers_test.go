package gpusim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// fast is a configuration with short steps for tests.
func fast() Config {
	return Config{
		StepBase:        2 * time.Millisecond,
		StepPerSeq:      -1,
		PrefillBase:     2 * time.Millisecond,
		PrefillPerToken: -1,
	}
}

// startSim serves a new Sim on a real loopback listener.
func startSim(t testing.TB, cfg Config) (*Sim, string) {
	t.Helper()
	s := New(cfg)
	srv := httptest.NewServer(s)
	t.Cleanup(func() {
		srv.Close()
		s.Close()
	})
	return s, srv.URL
}

// post sends body to url+path with optional headers (name, value, …).
func post(t testing.TB, ctx context.Context, url, path, body string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return resp
}

// event is one SSE data payload and when it was read.
type event struct {
	data string
	at   time.Time
}

// readEvents reads SSE events until EOF or [DONE]. It returns the events
// (without [DONE]), whether [DONE] came, and the read error, if any (also
// for a line that is not SSE data, or data after [DONE]). It may run on
// any goroutine.
func readEvents(_ testing.TB, body io.Reader) (evs []event, done bool, err error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			return evs, false, fmt.Errorf("line %q is not an SSE data line", line)
		}
		if data == "[DONE]" {
			for sc.Scan() {
				if sc.Text() != "" {
					return evs, true, fmt.Errorf("data after [DONE]: %q", sc.Text())
				}
			}
			return evs, true, sc.Err()
		}
		evs = append(evs, event{data, time.Now()})
	}
	return evs, false, sc.Err()
}

// chunk is a streamed chunk, chat or completion.
type chunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta *struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Text         *string         `json:"text"`
		Logprobs     json.RawMessage `json:"logprobs"`
		FinishReason *string         `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

func decodeChunk(t testing.TB, data string) chunk {
	t.Helper()
	var c chunk
	dec := json.NewDecoder(strings.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("chunk %s: %v", data, err)
	}
	return c
}

// errorBody is OpenAI's error shape.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	} `json:"error"`
}

// wantError checks resp is status with an OpenAI error body of code.
func wantError(t testing.TB, resp *http.Response, status int, code string) {
	t.Helper()
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Fatalf("status %d; want %d (body %s)", resp.StatusCode, status, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q; want application/json", ct)
	}
	var e errorBody
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		t.Fatalf("error body %s: %v", body, err)
	}
	if e.Error.Message == "" || e.Error.Type == "" || e.Error.Code != code {
		t.Errorf("error body %s; want a message, a type and code %q", body, code)
	}
}

// eventually polls cond every 5ms until it holds or 5s pass.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	// 15s: generous for a loaded CI machine running every package under
	// -race at once (a state that never comes still fails).
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // poll: Stats are counters, no event to wait on
	}
}

func isTruncated(err error) bool {
	return errors.Is(err, io.ErrUnexpectedEOF) || (err != nil && strings.Contains(err.Error(), "unexpected EOF"))
}

func chatBody(maxTokens int, stream, usage bool) string {
	m := map[string]any{
		"model":    "sim-small",
		"messages": []map[string]string{{"role": "user", "content": "Tell me about continuous batching."}},
		"stream":   stream,
	}
	if maxTokens > 0 {
		m["max_tokens"] = maxTokens
	}
	if usage {
		m["stream_options"] = map[string]bool{"include_usage": true}
	}
	b, _ := json.Marshal(m)
	return string(b)
}

func stringsReader(s string) io.Reader { return strings.NewReader(s) }

func counterValue(t testing.TB, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
