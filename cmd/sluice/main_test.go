package main

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/configs"
	"github.com/sluice-proxy/sluice/proxy/listen"
)

func runCmd(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("listeners:\n  htp: 127.0.0.1:80\nroutes:\n  - pool: nope\n"), 0o600)
	code, out, errs := runCmd(t, "", "check", "-c", bad)
	if code != 1 || out != "" {
		t.Fatalf("check bad: code %d, stdout %q; want 1 and nothing", code, out)
	}
	want := bad + `:2:3: unknown key "htp" in listeners (did you mean "http"?)` + "\n"
	if errs != want {
		t.Fatalf("check bad: got %q; want %q", errs, want)
	}
	code, out, _ = runCmd(t, "", "check", "-c", "../../configs/examples/single-pop.yaml")
	if code != 0 || out != "ok\n" {
		t.Fatalf("check good: code %d, %q; want 0 and ok", code, out)
	}
	if code, _, _ := runCmd(t, "", "check"); code != 2 {
		t.Fatalf("check without -c: code %d; want 2", code)
	}
	if code, _, errs := runCmd(t, "", "check", "--help"); code != 0 || !strings.Contains(errs, "Usage: sluice check") {
		t.Fatalf("check --help: code %d, %q", code, errs)
	}
}

func TestHashKey(t *testing.T) {
	code, out, _ := runCmd(t, "", "hash-key", demoKey)
	want := "sha256:1c590839af894cf25f9a5fe06929af05b377f60efbe55508ef93d251887b9213\n"
	if code != 0 || out != want {
		t.Fatalf("got %d %q; want %q", code, out, want)
	}
	if code, out, _ = runCmd(t, demoKey+"\n", "hash-key", "-"); out != want {
		t.Fatalf("from stdin: got %d %q; want %q", code, out, want)
	}
	if !bytes.Contains(configs.DefaultYAML(), []byte(strings.TrimSpace(want))) {
		t.Fatal("the embedded default does not hold the demo key's hash")
	}
}

func TestVersionAndHelp(t *testing.T) {
	if code, out, _ := runCmd(t, "", "version"); code != 0 || !strings.HasPrefix(out, "sluice ") {
		t.Fatalf("version: %d %q", code, out)
	}
	if code, out, _ := runCmd(t, "", "--help"); code != 0 || !strings.Contains(out, "sluice check -c FILE") {
		t.Fatalf("help: %d %q", code, out)
	}
	if code, _, _ := runCmd(t, "", "frobnicate"); code != 2 {
		t.Fatalf("unknown command: code %d; want 2", code)
	}
}

// The embedded default, on free ports: two simulators behind the proxy,
// the demo key works, tokens stream to [DONE].
func TestDefaultNodeServes(t *testing.T) {
	n := startDefaultNode(t)
	var banner bytes.Buffer
	printBanner(&banner, n, true)
	if !strings.Contains(banner.String(), "Authorization: Bearer sk-sluice-demo") {
		t.Fatalf("banner has no ready-to-paste curl command:\n%s", banner.String())
	}
	base := "http://" + n.Server().Addr(listen.ListenerHTTP)
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
		strings.NewReader(`{"model":"sim-small","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer "+demoKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	admin := "http://" + n.Server().Addr(listen.ListenerAdmin)
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := http.Get(admin + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
		if path == "/metrics" && !strings.Contains(string(b), `sluice_requests_total{code="200",proto="h1",route="openai",tenant="-"} 1`) {
			t.Fatalf("metrics do not count the request:\n%s", b)
		}
		if path == "/metrics" && (!strings.Contains(string(b), `sluice_backend_score{`) ||
			!strings.Contains(string(b), `sluice_queue_depth{class="batch",pool="sim"} 0`)) {
			t.Fatalf("metrics lack the pools' load and queue:\n%s", b)
		}
	}
}
