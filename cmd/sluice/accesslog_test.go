package main

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// lockedBuffer is a bytes.Buffer safe for the serving goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// With node.access_log's buffer, `sluice serve` holds the request lines
// (buffer not full, flush not due) and writes every one of them, whole,
// when SIGTERM stops it.
func TestServeAccessLogBufferedFlushedOnStop(t *testing.T) {
	cfg := nodeConfig{Node: "access_log: {buffer: 1MiB, flush: 1m}, drain_timeout: 1s"}.String()
	file := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr lockedBuffer
	done := make(chan int, 1)
	go func() { done <- cmdServe([]string{"-c", file}, &stdout, &stderr) }()
	var base string
	re := regexp.MustCompile(`http   (http://\S+)`)
	for deadline := time.Now().Add(10 * time.Second); base == ""; time.Sleep(10 * time.Millisecond) {
		if m := re.FindStringSubmatch(stdout.String()); m != nil {
			base = m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no banner; stderr:\n%s", stderr.String())
		}
	}
	const N = 20
	for range N {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
			strings.NewReader(`{"model":"sim-small","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer "+key1)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	http.DefaultClient.CloseIdleConnections()
	if n := strings.Count(stderr.String(), `"msg":"request"`); n != 0 {
		t.Fatalf("%d access lines written before the buffer filled or flush was due", n)
	}
	if !strings.Contains(stderr.String(), `"msg":"access log buffered"`) {
		t.Fatalf("no start line for the buffer:\n%s", stderr.String())
	}
	syscall.Kill(os.Getpid(), syscall.SIGTERM) // cmdServe's signal.Notify takes it
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("serve exited %d", code)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("SIGTERM did not stop serve")
	}
	out := stderr.String()
	if n := strings.Count(out, `"msg":"request"`); n != N {
		t.Fatalf("%d access lines after the stop; want %d:\n%s", n, N, out)
	}
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if !strings.HasPrefix(l, "{") || !strings.HasSuffix(l, "}") {
			t.Fatalf("broken line %q", l)
		}
	}
	if i, j := strings.LastIndex(out, `"msg":"request"`), strings.Index(out, `"msg":"shutting down"`); j < 0 || i > j {
		t.Fatalf("the access lines are not before the shutdown line (order kept): request at %d, shutdown at %d", i, j)
	}
}
