package configs

import (
	"strings"
	"testing"
	"time"
)

// node.access_log: off by default, flush defaults to 1s with a buffer,
// and out-of-range or orphan settings are refused at their line.
func TestAccessLogConfig(t *testing.T) {
	c, err := Parse("a.yaml", []byte(valid))
	if err != nil {
		t.Fatal(err)
	}
	if a := c.Node.AccessLog; a.Buffer != 0 || a.Flush != 0 {
		t.Fatalf("default access_log %+v; want off", a)
	}
	c, err = Parse("a.yaml", []byte(valid+"node:\n  access_log: {buffer: 64KiB}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if a := c.Node.AccessLog; a.Buffer != 64<<10 || a.Flush != time.Second {
		t.Fatalf("access_log %+v; want 64KiB, 1s", a)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"{buffer: 32MiB}", "a.yaml:10:24: node.access_log.buffer: 32MiB is out of range"},
		{"{buffer: 4KiB, flush: 2m}", "a.yaml:10:37: node.access_log.flush: 2m0s is out of range"},
		{"{flush: 5s}", "a.yaml:10:23: node.access_log.flush needs node.access_log.buffer"},
		{"{buffer: 4KiB, flush: -1s}", "a.yaml:10:37: node.access_log.flush: duration \"-1s\" must not be negative"},
	} {
		_, err := Parse("a.yaml", []byte(valid+"node:\n  access_log: "+tc.yaml+"\n"))
		if err == nil {
			t.Fatalf("%s: no error", tc.yaml)
		}
		var lines []string
		for _, e := range Errors(err) {
			lines = append(lines, e.Error())
		}
		if got := strings.Join(lines, "\n"); !strings.Contains(got, tc.want) {
			t.Errorf("%s: errors\n%s\nwant one containing %q", tc.yaml, got, tc.want)
		}
	}
	old, _ := Parse("a.yaml", []byte(valid))
	nw, _ := Parse("a.yaml", []byte(valid+"node:\n  access_log: {buffer: 64KiB}\n"))
	if rr := RestartRequired(old, nw); len(rr) == 0 || !strings.HasPrefix(rr[0].Path, "node.access_log") {
		t.Fatalf("RestartRequired: %+v; want node.access_log", rr)
	}
}
