package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-proxy/sluice/proxy/listen"
)

// sluice bench -protocol ws speaks the bridge protocol Sluice serves.
func TestBenchOverWebSocket(t *testing.T) {
	n := startDefaultNode(t)
	var stdout, stderr bytes.Buffer
	out := filepath.Join(t.TempDir(), "report.json")
	code := cmdBench([]string{"-target", "http://" + n.Server().Addr(listen.ListenerHTTP), "-protocol", "ws",
		"-api-key", demoKey, "-model", "sim-small", "-requests", "6", "-concurrency", "3", "-output-tokens", "5",
		"-progress", "never", "-json", out}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Targets []struct {
			Counts struct {
				Sent, OK int
			} `json:"counts"`
			OutputTokens int64 `json:"output_tokens"`
			Stages       []struct {
				Name string `json:"name"`
			} `json:"stages"`
		} `json:"targets"`
	}
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("report %s: %v", raw, err)
	}
	if len(rep.Targets) != 1 || rep.Targets[0].Counts.OK != 6 || rep.Targets[0].OutputTokens != 30 {
		t.Fatalf("report %s; want 6 ok requests and 30 tokens over the bridge", raw)
	}
	// The done frames' timing gives the same stage split as Server-Timing.
	stages := map[string]bool{}
	for _, s := range rep.Targets[0].Stages {
		stages[s.Name] = true
	}
	for _, want := range []string{"network", "upstream", "prefill", "ttft", "decode", "itl-p50"} {
		if !stages[want] {
			t.Errorf("bench report stages %v lack %q\n%s", stages, want, stdout.String())
		}
	}
}
