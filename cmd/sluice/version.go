package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version is set by release builds with -ldflags "-X main.version=v1.2.3"
// (deploy/build.sh); "dev" otherwise, when the module version is used if
// the binary was built by "go install module@version".
var version = "dev"

// readBuildInfo is debug.ReadBuildInfo (a variable for tests).
var readBuildInfo = debug.ReadBuildInfo

// sluiceVersion is the version the node reports: the stamped one, else
// the module's version from the build info, else "dev".
func sluiceVersion(bi *debug.BuildInfo) string {
	if version != "dev" || bi == nil {
		return version
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	return version
}

// versionString is "sluice VERSION (GOVERSION)", for the banner and logs.
func versionString() string {
	bi, _ := readBuildInfo()
	goVersion := runtime.Version()
	if bi != nil && bi.GoVersion != "" {
		goVersion = bi.GoVersion
	}
	return fmt.Sprintf("sluice %s (%s)", sluiceVersion(bi), goVersion)
}

// cmdVersion prints the version and what the build info says of the
// binary: the module and its version, the VCS revision and commit time
// ("(modified)" when the work tree had changes), the Go version and the
// platform. Values the build did not record are "unknown" (go test and
// go run binaries record no VCS facts; -trimpath builds do).
func cmdVersion(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintln(stderr, "Usage: sluice version\n\nPrints the version and the build info (module, VCS revision and time, Go version).")
		if args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
			return 0
		}
		return 2
	}
	writeVersion(stdout)
	return 0
}

func writeVersion(w io.Writer) {
	bi, ok := readBuildInfo()
	if !ok {
		bi = nil
	}
	fmt.Fprintln(w, "sluice", sluiceVersion(bi))
	module, modVersion, goVersion := "unknown", "unknown", runtime.Version()
	settings := map[string]string{}
	if bi != nil {
		module, modVersion = bi.Main.Path, bi.Main.Version
		if bi.GoVersion != "" {
			goVersion = bi.GoVersion
		}
		for _, s := range bi.Settings {
			settings[s.Key] = s.Value
		}
	}
	or := func(s string) string {
		if s == "" {
			return "unknown"
		}
		return s
	}
	rev := or(settings["vcs.revision"])
	if settings["vcs.modified"] == "true" {
		rev += " (modified)"
	}
	fmt.Fprintf(w, "  module    %s %s\n", or(module), or(modVersion))
	fmt.Fprintf(w, "  revision  %s\n", rev)
	fmt.Fprintf(w, "  time      %s\n", or(settings["vcs.time"]))
	fmt.Fprintf(w, "  go        %s\n", goVersion)
	fmt.Fprintf(w, "  platform  %s/%s\n", or(settings["GOOS"]), or(settings["GOARCH"]))
}
