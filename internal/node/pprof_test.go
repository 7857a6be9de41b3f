package node

import (
	"net/http"
	"strings"
	"testing"
)

// TestPprofBehindFlag: the profiler is absent from the admin listener
// unless serve --pprof turns it on.
func TestPprofBehindFlag(t *testing.T) {
	tn := startFileNode(t, nodeConfig{}.String())
	resp, err := http.Get(tn.admin + "/debug/pprof/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("without --pprof: /debug/pprof/cmdline answered %s, want 404", resp.Status)
	}
	tn.n.EnablePprof()
	if body := tn.get(tn.admin + "/debug/pprof/"); !strings.Contains(body, "goroutine") {
		t.Fatalf("with --pprof: /debug/pprof/ index lacks the goroutine profile:\n%.300s", body)
	}
	if body := tn.get(tn.admin + "/debug/pprof/goroutine?debug=1"); !strings.Contains(body, "goroutine profile") {
		t.Fatalf("goroutine profile: %.300s", body)
	}
}
