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
