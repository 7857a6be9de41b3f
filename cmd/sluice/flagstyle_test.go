package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Flags are written Go's way, with one dash, in every command's usage text
// and wherever the README and docs/ name a Sluice flag ("-diff", not
// "--diff"); other programs' flags (curl --http3-only) are left alone.
func TestOneFlagStyle(t *testing.T) {
	flagLine := regexp.MustCompile(`(?m)^  -([a-z0-9][a-z0-9-]*)`)
	double := regexp.MustCompile(`(?:^|[^-\w])--([a-z][a-z0-9-]*)`)
	names := map[string]bool{"help": true}
	for _, cmd := range []string{"serve", "check", "sim", "bench", "diagnose"} {
		_, out, errs := runCmd(t, "", cmd, "-help")
		text := out + errs
		for _, m := range flagLine.FindAllStringSubmatch(text, -1) {
			names[m[1]] = true
		}
		for _, line := range strings.Split(text, "\n") {
			if strings.Contains(line, "curl") {
				continue
			}
			if m := double.FindStringSubmatch(line); m != nil {
				t.Errorf("sluice %s -help: %q uses --%s", cmd, line, m[1])
			}
		}
	}
	if !names["diff"] || !names["admin"] || !names["pprof"] {
		t.Fatalf("flag names not found in the usage texts: %v", names)
	}
	_, usage, _ := runCmd(t, "", "help")
	if m := double.FindString(usage); m != "" {
		t.Errorf("sluice help uses %q", m)
	}
	docs, _ := filepath.Glob("../../docs/*.md")
	for _, f := range append(docs, "../../README.md") {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(data), "\n") {
			for _, m := range double.FindAllStringSubmatch(line, -1) {
				if names[m[1]] && !strings.Contains(line, "curl") {
					t.Errorf("%s:%d: --%s (write -%s): %s", filepath.Base(f), i+1, m[1], m[1], line)
				}
			}
		}
	}
}
