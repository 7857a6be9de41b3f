package observe

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// writes records every Write the LogWriter makes to its destination.
type writes struct {
	mu    sync.Mutex
	calls []string
}

func (w *writes) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls = append(w.calls, string(p))
	return len(p), nil
}

func (w *writes) snapshot() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.calls...)
}

func TestLogWriterUnbuffered(t *testing.T) {
	var w writes
	lw := NewLogWriter(&w)
	lw.line([]byte("a\n"))
	lw.line([]byte("b\n"))
	if got := w.snapshot(); len(got) != 2 || got[0] != "a\n" || got[1] != "b\n" {
		t.Fatalf("unbuffered writes: %q; want one per line", got)
	}
}

// Lines are held until the next would not fit, then written in one call;
// a line larger than the buffer goes on its own after the buffered ones.
func TestLogWriterFull(t *testing.T) {
	var w writes
	lw := NewLogWriter(&w)
	lw.SetBuffer(10, time.Hour)
	defer lw.Close()
	lw.line([]byte("1234\n"))
	lw.line([]byte("5678\n")) // 10 bytes: fits exactly
	if got := w.snapshot(); len(got) != 0 {
		t.Fatalf("written before the buffer filled: %q", got)
	}
	lw.line([]byte("9\n")) // does not fit: the two go first
	if got := w.snapshot(); len(got) != 1 || got[0] != "1234\n5678\n" {
		t.Fatalf("after overflow: %q", got)
	}
	lw.line([]byte("a long line of 25 bytes.\n"))
	if got := w.snapshot(); len(got) != 3 || got[1] != "9\n" || got[2] != "a long line of 25 bytes.\n" {
		t.Fatalf("outsized line: %q", got)
	}
}

// The flush timer writes lines that waited flush, and is disarmed while
// the buffer is empty.
func TestLogWriterFlushTimer(t *testing.T) {
	var w writes
	lw := NewLogWriter(&w)
	lw.SetBuffer(1<<20, 50*time.Millisecond)
	defer lw.Close()
	start := time.Now()
	lw.line([]byte("x\n"))
	lw.line([]byte("y\n"))
	for len(w.snapshot()) == 0 {
		if time.Since(start) > 5*time.Second {
			t.Fatal("the flush timer did not write the buffer")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("written after %v; want no sooner than the 50ms flush", d)
	}
	if got := w.snapshot(); len(got) != 1 || got[0] != "x\ny\n" {
		t.Fatalf("timer flush: %q", got)
	}
	lw.mu.Lock()
	armed := lw.armed
	lw.mu.Unlock()
	if armed {
		t.Fatal("timer armed with an empty buffer")
	}
	lw.line([]byte("z\n")) // a new line re-arms it
	for deadline := time.Now().Add(5 * time.Second); len(w.snapshot()) < 2 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if got := w.snapshot(); len(got) != 2 || got[1] != "z\n" {
		t.Fatalf("second timer flush: %q", got)
	}
}

// A slog line is never held back and keeps its place after the buffered
// access lines (one write when both fit); Close writes what is left and
// later lines go out at once.
func TestLogWriterOrderAndClose(t *testing.T) {
	var w writes
	lw := NewLogWriter(&w)
	lw.SetBuffer(1<<10, time.Hour)
	log := slog.New(slog.NewTextHandler(lw, nil))
	lw.line([]byte("access 1\n"))
	log.Warn("backend down")
	got := w.snapshot()
	if len(got) != 1 || !strings.HasPrefix(got[0], "access 1\n") || !strings.Contains(got[0], "backend down") {
		t.Fatalf("warning after a buffered line: %q", got)
	}
	lw.line([]byte("access 2\n"))
	if err := lw.Close(); err != nil {
		t.Fatal(err)
	}
	lw.line([]byte("access 3\n"))
	if got := w.snapshot(); len(got) != 3 || got[1] != "access 2\n" || got[2] != "access 3\n" {
		t.Fatalf("close and after: %q", got)
	}
}

// Lines from many goroutines, buffered and mixed with slog lines, are all
// written, whole, each once.
func TestLogWriterConcurrent(t *testing.T) {
	var out syncBuffer
	lw := NewLogWriter(&out)
	lw.SetBuffer(4<<10, time.Millisecond)
	log := slog.New(slog.NewTextHandler(lw, nil))
	const G, N = 8, 500
	var wg sync.WaitGroup
	for g := range G {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range N {
				if i%50 == 0 {
					log.Info("slog", "g", g, "i", i)
					continue
				}
				lw.line(fmt.Appendf(nil, "line g=%d i=%d %s\n", g, i, strings.Repeat("x", i%97)))
			}
		}()
	}
	wg.Wait()
	lw.Close()
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != G*N {
		t.Fatalf("%d lines; want %d", len(lines), G*N)
	}
	seen := map[string]bool{}
	for _, l := range lines {
		var g, i int
		switch {
		case strings.HasPrefix(l, "line "):
			if _, err := fmt.Sscanf(l, "line g=%d i=%d", &g, &i); err != nil || !strings.HasSuffix(l, " "+strings.Repeat("x", i%97)) {
				t.Fatalf("broken line %q", l)
			}
		case strings.Contains(l, "msg=slog"):
			if _, err := fmt.Sscanf(l[strings.Index(l, " g="):], " g=%d i=%d", &g, &i); err != nil {
				t.Fatalf("broken slog line %q", l)
			}
		default:
			t.Fatalf("broken line %q", l)
		}
		k := fmt.Sprint(g, " ", i)
		if seen[k] {
			t.Fatalf("line %s twice", k)
		}
		seen[k] = true
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The access log's lines go through a LogWriter's buffer.
func TestAccessLogBuffered(t *testing.T) {
	var w writes
	lw := NewLogWriter(&w)
	lw.SetBuffer(64<<10, time.Hour)
	a := NewAccessLog(lw, "json")
	for range 3 {
		a.Write(&Record{ID: "r", Start: time.Unix(0, 0), End: time.Unix(1, 0)})
	}
	if got := w.snapshot(); len(got) != 0 {
		t.Fatalf("written with room in the buffer: %q", got)
	}
	lw.Flush()
	got := w.snapshot()
	if len(got) != 1 || strings.Count(got[0], "\n") != 3 {
		t.Fatalf("flush: %q; want the three lines in one write", got)
	}
}

// BenchmarkAccessLogFile is one access log line of a small request written
// to a file, unbuffered (one write(2) per line) and through a 64 KiB
// buffer flushed every second:
//
//	go test -run '^$' -bench BenchmarkAccessLogFile -benchmem -count 6 ./proxy/observe/
func BenchmarkAccessLogFile(b *testing.B) {
	r := &Record{ID: "3f2a9c0d4e5b6a7f8091a2b3c4d5e6f7", Client: "127.0.0.1", Tenant: "bench", Method: "POST",
		Path: "/v1/chat/completions", Proto: "h1", Status: 200, Backend: "127.0.0.1:8000", Model: "sim-stream",
		Start: time.Unix(1e9, 0), End: time.Unix(1e9, 2e6)}
	for _, buffered := range []bool{false, true} {
		name := "unbuffered"
		if buffered {
			name = "buffer-64KiB"
		}
		b.Run(name, func(b *testing.B) {
			f, err := os.Create(filepath.Join(b.TempDir(), "access.log"))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			lw := NewLogWriter(f)
			if buffered {
				lw.SetBuffer(64<<10, time.Second)
			}
			a := NewAccessLog(lw, "json")
			b.ReportAllocs()
			for b.Loop() {
				a.Write(r)
			}
			lw.Close()
		})
	}
}
