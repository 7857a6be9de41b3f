package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/configs"
)

// check -diff on a crafted pair of files, and against a running node.
func TestCheckDiff(t *testing.T) {
	dir := t.TempDir()
	oldCfg := nodeConfig{Tenants: tenant("acme", "max_concurrency: 64, tokens_per_minute: 400000", key1) + tenant("gone", "", "sk-gone")}.String()
	newCfg := nodeConfig{
		Tenants: tenant("acme", "max_concurrency: 32, tokens_per_minute: 400000", key1, "sk-rotated") + tenant("newco", "", "sk-new"),
		Pools:   "  - {name: p, backends: [{url: \"sim://gpu-a\"}, {url: \"sim://gpu-b\"}]}\n",
		Routes:  "  - {name: main, path: /v1/, models: [sim-small], pool: p, enforce_limits: false}\n",
	}.String()
	newCfg = strings.Replace(newCfg, "http: 127.0.0.1:0", "http: 127.0.0.1:8081", 1)
	oldPath, newPath := filepath.Join(dir, "old.yaml"), filepath.Join(dir, "new.yaml")
	os.WriteFile(oldPath, []byte(oldCfg), 0o600)
	os.WriteFile(newPath, []byte(newCfg), 0o600)

	code, out, errs := runCmd(t, "", "check", "-c", newPath, "--diff", oldPath)
	want := `ok
changes ` + configs.Version([]byte(oldCfg)) + ` → ` + configs.Version([]byte(newCfg)) + `:
routes:
  ~ changed "main": enforce_limits (default) → false
pools:
  ~ changed "p": backend added sim://gpu-b
tenants:
  ~ "acme" keys: 1 added (` + shortKey("sk-rotated") + `)
  - removed "gone" (1 key)
  + added "newco" (1 key)
limits:
  ~ "acme" max_concurrency 64 → 32 (lowered)
restart required:
  listeners.http 127.0.0.1:0 → 127.0.0.1:8081
`
	if code != 0 || out != want {
		t.Fatalf("code %d, stderr %q, output:\n%s\nwant:\n%s", code, errs, out, want)
	}

	// Against a running node's admin endpoint: same result.
	tn := startFileNode(t, oldCfg)
	code, out2, errs := runCmd(t, "", "check", "-c", newPath, "--diff", tn.admin)
	if code != 0 || strings.SplitN(out2, "\n", 3)[2] != strings.SplitN(out, "\n", 3)[2] {
		t.Fatalf("--diff URL: code %d %q\n%s", code, errs, out2)
	}
	if code, _, errs := runCmd(t, "", "check", "-c", newPath, "--diff", filepath.Join(dir, "missing.yaml")); code != 2 || !strings.Contains(errs, "missing.yaml") {
		t.Fatalf("--diff with a missing file: %d %q", code, errs)
	}
	if code, out, _ := runCmd(t, "", "check", "-c", oldPath, "--diff", oldPath); code != 0 || !strings.Contains(out, "no changes") {
		t.Fatalf("--diff with itself: %d %q", code, out)
	}
}

func shortKey(k string) string {
	h := configsHash(k)
	return h[:len("sha256:")+8] + "…"
}

// sluice check warns loudly when the admin listener binds a non-loopback
// address with no token, and stays quiet on loopback or with a token.
func TestAttackAdminExposedCheckWarns(t *testing.T) {
	dir := t.TempDir()
	tokenPath := filepath.Join(dir, "admin.token")
	os.WriteFile(tokenPath, []byte("adm-secret\n"), 0o600)
	base := nodeConfig{}.String()
	for _, tc := range []struct {
		name, admin, extra string
		warn               bool
	}{
		{"all interfaces", "0.0.0.0:9090", "", true},
		{"no host", ":9090", "", true},
		{"LAN address", "10.1.2.3:9090", "", true},
		{"IPv6 any", "[::]:9090", "", true},
		{"loopback", "127.0.0.1:9090", "", false},
		{"localhost", "localhost:9090", "", false},
		{"IPv6 loopback", "[::1]:9090", "", false},
		{"token", "0.0.0.0:9090", "admin: {token_file: " + tokenPath + "}\n", false},
	} {
		path := filepath.Join(dir, "c.yaml")
		os.WriteFile(path, []byte(strings.Replace(base, "admin: 127.0.0.1:0", "admin: \""+tc.admin+"\"", 1)+tc.extra), 0o600)
		code, out, errs := runCmd(t, "", "check", "-c", path)
		if code != 0 || out != "ok\n" {
			t.Fatalf("%s: code %d, %q %q", tc.name, code, out, errs)
		}
		if got := strings.Contains(errs, "WARNING: listeners.admin"); got != tc.warn {
			t.Errorf("%s: warning %v; want %v (stderr %q)", tc.name, got, tc.warn, errs)
		}
	}
	// A token file that cannot be read is an error, not a silent open door.
	path := filepath.Join(dir, "c.yaml")
	os.WriteFile(path, []byte(base+"admin: {token_file: "+filepath.Join(dir, "missing.token")+"}\n"), 0o600)
	if code, _, errs := runCmd(t, "", "check", "-c", path); code != 1 || !strings.Contains(errs, "admin.token_file") {
		t.Errorf("missing token file: code %d, %q", code, errs)
	}
}

// check -diff and diagnose read a running node that requires an admin
// token when given --admin-token-file.
func TestCheckDiffAdminToken(t *testing.T) {
	dir := t.TempDir()
	tokenPath := filepath.Join(dir, "admin.token")
	os.WriteFile(tokenPath, []byte("adm-secret\n"), 0o600)
	cfg := nodeConfig{}.String() + "admin: {token_file: " + tokenPath + "}\n"
	tn := startFileNode(t, cfg)
	path := filepath.Join(dir, "c.yaml")
	os.WriteFile(path, []byte(cfg), 0o600)
	if code, _, errs := runCmd(t, "", "check", "-c", path, "--diff", tn.admin); code != 2 || !strings.Contains(errs, "401") {
		t.Fatalf("--diff without the token: code %d, %q", code, errs)
	}
	code, out, errs := runCmd(t, "", "check", "-c", path, "--diff", tn.admin, "--admin-token-file", tokenPath)
	if code != 0 || !strings.Contains(out, "no changes") {
		t.Fatalf("--diff with the token: code %d, %q %q", code, out, errs)
	}
	// sluice diagnose reads /debug/stats the same way.
	if code, _, errs := runCmd(t, "", "diagnose", "--admin", tn.admin); code != 2 || !strings.Contains(errs, "401") {
		t.Fatalf("diagnose without the token: code %d, %q", code, errs)
	}
	if code, out, errs := runCmd(t, "", "diagnose", "--admin", tn.admin, "--admin-token-file", tokenPath); code != 0 || !strings.Contains(out, "nothing to diagnose") {
		t.Fatalf("diagnose with the token: code %d, %q %q", code, out, errs)
	}
}
