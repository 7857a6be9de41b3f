package gpusim_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/sluice-proxy/sluice/internal/gpusim"
)

func ExampleNew() {
	sim := gpusim.New(gpusim.Config{Model: "demo", Seed: 42, StepBase: -1, PrefillBase: -1})
	defer sim.Close()
	srv := httptest.NewServer(sim)
	defer srv.Close()

	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(
		`{"model":"demo","messages":[{"role":"user","content":"Say something."}],"max_tokens":6}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	var out struct {
		Choices []struct {
			Message      struct{ Content string }
			FinishReason string `json:"finish_reason"`
		}
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%q %s %d+%d\n", out.Choices[0].Message.Content, out.Choices[0].FinishReason,
		out.Usage.PromptTokens, out.Usage.CompletionTokens)
	// Output: "Well here stream takes most then," length 4+6
}
