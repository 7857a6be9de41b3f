package observe

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// TestAccessLogLine checks both formats of a line against what slog
// writes for the same fields: JSON that encoding/json reads back to the
// same values, and text that reads as key=value pairs.
func TestAccessLogLine(t *testing.T) {
	at := time.Date(2026, 12, 3, 2, 3, 4, 5_006_007, time.UTC)
	fields := func(l *line) {
		l.str("request_id", "r-1")
		l.str("path", "/v1/a b\"c\\d\n\x01\u2028é\xff")
		l.str("empty", "")
		l.int("status", 200)
		l.ms("e2e_ms", 1234567*time.Nanosecond)
		l.ms("tiny_ms", 400*time.Nanosecond)
		l.ms("neg_ms", -1500*time.Microsecond)
		l.boolean("hedged", true)
	}
	var buf bytes.Buffer
	a := NewAccessLog(&buf, "json")
	l := a.begin(at)
	fields(&l)
	a.end(&l)
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("%q: %v", buf.String(), err)
	}
	if bytes.Count(buf.Bytes(), []byte("\n")) != 1 {
		t.Fatalf("not one line: %q", buf.String())
	}
	want := map[string]any{
		"time": "2026-12-03T02:03:04.005006007Z", "level": "INFO", "msg": "request", "request_id": "r-1",
		"path": "/v1/a b\"c\\d\n\x01\u2028é\ufffd", "empty": "", "status": 200.0,
		"e2e_ms": 1.235, "tiny_ms": 0.0, "neg_ms": -1.5, "hedged": true,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("json %s = %#v; want %#v", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("json has %d fields; want %d: %v", len(got), len(want), got)
	}
	// The time field is slog's, so both kinds of line sort and parse alike.
	var sl bytes.Buffer
	slog.New(slog.NewJSONHandler(&sl, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			a.Value = slog.TimeValue(at)
		}
		return a
	}})).Info("request")
	if !strings.HasPrefix(buf.String(), strings.TrimSuffix(sl.String(), "}\n")) {
		t.Errorf("line %q does not begin as slog's %q", buf.String(), sl.String())
	}

	buf.Reset()
	a = NewAccessLog(&buf, "text")
	l = a.begin(at)
	fields(&l)
	a.end(&l)
	const wantText = `time=2026-12-03T02:03:04.005Z level=INFO msg=request request_id=r-1 ` +
		`path="/v1/a b\"c\\d\n\x01\u2028é\xff" empty="" status=200 e2e_ms=1.235 tiny_ms=0.000 neg_ms=-1.500 hedged=true` + "\n"
	if buf.String() != wantText {
		t.Errorf("text line\n%q; want\n%q", buf.String(), wantText)
	}
}

// FuzzAppendJSONString checks that any string, valid UTF-8 or not, makes
// a JSON string that encoding/json reads back as the string with invalid
// bytes replaced.
func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "plain", "q\"b\\", "\x00\x1f\x7f", "\u2028\u2029", "é\xffx", "\xed\xa0\x80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := appendJSONString(nil, s)
		var got string
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%q -> %s: %v", s, b, err)
		}
		if want := replaceEach(s); got != want {
			t.Fatalf("%q -> %s -> %q; want %q", s, b, got, want)
		}
		if bytes.ContainsAny(b, "\n\r") {
			t.Fatalf("%q -> %s holds a line break", s, b)
		}
	})
}

// replaceEach replaces every invalid byte by U+FFFD (strings.ToValidUTF8
// replaces a run of them by one).
func replaceEach(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		b.WriteRune(r)
		i += n
	}
	return b.String()
}
