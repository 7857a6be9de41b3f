package main

import (
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// sluice version prints the stamped version and the build info: module,
// VCS revision (marked when modified), commit time, Go version, platform.
func TestVersionPrintsBuildInfo(t *testing.T) {
	oldVersion, oldRead := version, readBuildInfo
	t.Cleanup(func() { version, readBuildInfo = oldVersion, oldRead })
	readBuildInfo = func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/sluice-proxy/sluice", Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
				{Key: "vcs.time", Value: "2026-12-03T14:00:00Z"}, {Key: "vcs.modified", Value: "true"},
				{Key: "GOOS", Value: "linux"}, {Key: "GOARCH", Value: "amd64"}}}, true
	}
	version = "v1.4.2"
	code, out, _ := runCmd(t, "", "version")
	want := `sluice v1.4.2
  module    github.com/sluice-proxy/sluice (devel)
  revision  0123456789abcdef0123456789abcdef01234567 (modified)
  time      2026-12-03T14:00:00Z
  go        go1.26.8
  platform  linux/amd64
`
	if code != 0 || out != want {
		t.Fatalf("version: code %d\n%s\nwant\n%s", code, out, want)
	}
	if got := versionString(); got != "sluice v1.4.2 (go1.26.8)" {
		t.Fatalf("versionString %q", got)
	}

	// Unstamped, a module version from "go install ...@v1.5.0" is used.
	version = "dev"
	readBuildInfo = func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/sluice-proxy/sluice", Version: "v1.5.0"}}, true
	}
	if _, out, _ := runCmd(t, "", "version"); !strings.HasPrefix(out, "sluice v1.5.0\n") || !strings.Contains(out, "revision  unknown\n") {
		t.Fatalf("module version: %q", out)
	}

	// The real build info of this test binary.
	readBuildInfo = oldRead
	if _, out, _ := runCmd(t, "", "version"); !strings.HasPrefix(out, "sluice dev\n") ||
		!strings.Contains(out, "  go        "+runtime.Version()+"\n") || !strings.Contains(out, "github.com/sluice-proxy/sluice") {
		t.Fatalf("real build info: %q", out)
	}
	if code, _, _ := runCmd(t, "", "version", "extra"); code != 2 {
		t.Fatalf("version with an argument: code %d; want 2", code)
	}
}

// SLUICE_CONFIG is the default for -c in check and serve; -c overrides it.
func TestConfigFromEnvironment(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("listeners:\n  htp: 127.0.0.1:80\n"), 0o600)
	good := "../../configs/examples/single-pop.yaml"

	t.Setenv("SLUICE_CONFIG", good)
	if code, out, errs := runCmd(t, "", "check"); code != 0 || out != "ok\n" {
		t.Fatalf("check with SLUICE_CONFIG: code %d %q %q", code, out, errs)
	}
	if code, _, errs := runCmd(t, "", "check", "-c", bad); code != 1 || !strings.Contains(errs, bad+":2:3:") {
		t.Fatalf("-c does not override SLUICE_CONFIG: code %d %q", code, errs)
	}

	t.Setenv("SLUICE_CONFIG", bad)
	if code, _, errs := runCmd(t, "", "check"); code != 1 || !strings.Contains(errs, bad+":2:3:") {
		t.Fatalf("check reads SLUICE_CONFIG: code %d %q", code, errs)
	}
	// serve (and plain "sluice") load it too: the bad file stops them
	// before any listener opens.
	for _, args := range [][]string{{"serve"}, nil} {
		if code, _, errs := runCmd(t, "", args...); code != 1 || !strings.Contains(errs, bad+":2:3:") {
			t.Fatalf("%v with SLUICE_CONFIG: code %d %q", args, code, errs)
		}
	}
}

// sluice check reads the secret files and variables a config names: a
// missing one is reported at its key; -diff between two files says that
// a rotated key changed and never prints it.
func TestCheckReadsSecrets(t *testing.T) {
	dir := t.TempDir()
	cfg := "listeners: {http: 127.0.0.1:8080}\npools:\n  - name: p\n    api_key_file: pool.key\n    backends: [{url: \"http://127.0.0.1:8000\"}]\nroutes:\n  - pool: p\n"
	path := filepath.Join(dir, "sluice.yaml")
	os.WriteFile(path, []byte(cfg), 0o600)
	if code, _, errs := runCmd(t, "", "check", "-c", path); code != 1 || !strings.HasPrefix(errs, path+":4:19: pools[0].api_key_file: open ") {
		t.Fatalf("check without the key file: code %d %q", code, errs)
	}
	os.WriteFile(filepath.Join(dir, "pool.key"), []byte("sk-old-backend-key\n"), 0o600)
	old := filepath.Join(dir, "old.yaml")
	os.WriteFile(old, []byte(cfg), 0o600)
	if code, out, errs := runCmd(t, "", "check", "-c", path, "-diff", old); code != 0 || !strings.Contains(out, "no changes") {
		t.Fatalf("check -diff, same key: code %d %q %q", code, out, errs)
	}
	// old.yaml names a key file of its own, rotated
	os.WriteFile(filepath.Join(dir, "old.key"), []byte("sk-older-backend-key\n"), 0o600)
	os.WriteFile(old, []byte(strings.Replace(cfg, "pool.key", "old.key", 1)), 0o600)
	code, out, errs := runCmd(t, "", "check", "-c", path, "-diff", old)
	if code != 0 || !strings.Contains(out, `api_key (changed)`) || strings.Contains(out+errs, "backend-key") {
		t.Fatalf("check -diff, rotated key: code %d %q %q", code, out, errs)
	}
}
