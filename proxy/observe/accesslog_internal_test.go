package observe

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
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

// gateWriter records Write calls; while gate is set the first Write waits
// for it to close, and a Write that overlaps another fails the test.
type gateWriter struct {
	t       *testing.T
	mu      sync.Mutex
	buf     bytes.Buffer
	writes  int
	busy    atomic.Bool
	gate    chan struct{}
	entered chan struct{}
}

func (w *gateWriter) Write(p []byte) (int, error) {
	if !w.busy.CompareAndSwap(false, true) {
		w.t.Error("two Writes at once")
	}
	defer w.busy.Store(false)
	w.mu.Lock()
	first := w.writes == 0
	w.writes++
	w.mu.Unlock()
	if first && w.gate != nil {
		close(w.entered)
		<-w.gate
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// TestAccessLogBatches: lines ended while a write is under way are
// written by that request, in one Write, before it returns; every line
// arrives whole and once, Writes never overlap, and requests wait only
// when maxPending is full.
func TestAccessLogBatches(t *testing.T) {
	w := &gateWriter{t: t, gate: make(chan struct{}), entered: make(chan struct{})}
	var open sync.Once
	release := func() { open.Do(func() { close(w.gate) }) }
	t.Cleanup(release) // a failed test does not leave its requests blocked
	a := NewAccessLog(w, "json")
	write := func(id string) {
		l := a.begin(time.Unix(0, 0))
		l.str("request_id", id)
		a.end(&l)
	}
	firstDone := make(chan struct{})
	go func() { defer close(firstDone); write("first") }()
	<-w.entered // the first request is inside its Write

	// Lines ended now are batched and their requests return at once.
	const n = 50
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); write(fmt.Sprintf("b%03d", i)) }()
	}
	batched := make(chan struct{})
	go func() { wg.Wait(); close(batched) }()
	select {
	case <-batched:
	case <-time.After(5 * time.Second):
		t.Fatal("requests waited for another request's write")
	}
	select {
	case <-firstDone:
		t.Fatal("the writing request returned while its Write was blocked")
	default:
	}

	// Past maxPending a request waits for the write under way.
	a.mu.Lock()
	fill := maxPending - len(a.pending)
	a.mu.Unlock()
	long := strings.Repeat("x", fill)
	write(long) // fills pending to at least maxPending; returns at once
	blocked := make(chan struct{})
	go func() { defer close(blocked); write("after") }()
	select {
	case <-blocked:
		t.Fatal("a request did not wait with pending full")
	case <-time.After(50 * time.Millisecond):
	}
	release()
	<-firstDone
	<-blocked
	// "after" may have been written by its own request after the batch:
	// wait for every Write to end.
	for w.busy.Load() {
		time.Sleep(time.Millisecond)
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	lines := strings.Split(strings.TrimSuffix(w.buf.String(), "\n"), "\n")
	if len(lines) != n+3 {
		t.Fatalf("%d lines; want %d", len(lines), n+3)
	}
	seen := map[string]int{}
	for _, ln := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(ln), &m); err != nil {
			t.Fatalf("line %.80q: %v", ln, err)
		}
		id, _ := m["request_id"].(string)
		seen[id]++
	}
	if seen["first"] != 1 || seen["after"] != 1 || seen[long] != 1 {
		t.Fatalf("first/after/long seen %d/%d/%d times", seen["first"], seen["after"], seen[long])
	}
	for i := range n {
		if id := fmt.Sprintf("b%03d", i); seen[id] != 1 {
			t.Fatalf("%s seen %d times", id, seen[id])
		}
	}
	if !strings.Contains(lines[0], `"first"`) {
		t.Fatalf("first line %.80q is not the first request's", lines[0])
	}
	// first, one batch of the 50 and the long line, then "after" alone
	// or with them: at most 3 Writes, not 53.
	if w.writes > 3 {
		t.Fatalf("%d Writes for %d lines; want at most 3", w.writes, len(lines))
	}
}
