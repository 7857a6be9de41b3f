package observe

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestRawLogOutKinds: regular files, character devices and sockets get raw
// writes; pipes, other writers and SLUICE_LOG_RAW=0 keep their Write.
func TestRawLogOutKinds(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	a, b := socketPair(t)
	defer a.Close()
	defer b.Close()
	for _, c := range []struct {
		name     string
		w        io.Writer
		raw, soc bool
	}{
		{"file", f, true, false}, {"devnull", null, true, false}, {"socket", a, true, true},
		{"pipe", pw, false, false}, {"buffer", &bytes.Buffer{}, false, false},
	} {
		o, ok := NewLogWriter(c.w).w.(*rawOut)
		if ok != c.raw || ok && o.sock != c.soc {
			t.Errorf("%s: raw %v (want %v), socket %v (want %v)", c.name, ok, c.raw, ok && o.sock, c.soc)
		}
	}
	t.Setenv("SLUICE_LOG_RAW", "0")
	if _, ok := NewLogWriter(f).w.(*rawOut); ok {
		t.Error("SLUICE_LOG_RAW=0: raw writes")
	}
}

// TestRawLogOutFile: lines written raw to a file read back whole, in order,
// buffered or not.
func TestRawLogOutFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l := NewLogWriter(f)
	var want bytes.Buffer
	for i := range 200 {
		line := fmt.Sprintf("{\"n\":%d,\"pad\":%q}\n", i, bytes.Repeat([]byte("x"), i*13))
		want.WriteString(line)
		if i%2 == 0 {
			l.line([]byte(line))
		} else if _, err := l.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
		if i == 100 {
			l.SetBuffer(4096, time.Hour)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("file holds %d bytes, want %d (first difference at %d)", len(got), want.Len(), firstDiff(got, want.Bytes()))
	}
}

// TestRawLogOutSocketFull: a socket whose reader is slower than the writer
// fills; the raw send meets EAGAIN and the rest goes through os.File's
// blocking Write: every byte arrives, in order.
func TestRawLogOutSocketFull(t *testing.T) {
	a, b := socketPair(t)
	defer b.Close()
	syscall.SetsockoptInt(int(a.Fd()), syscall.SOL_SOCKET, syscall.SO_SNDBUF, 4096)
	l := NewLogWriter(a)
	o, ok := l.w.(*rawOut)
	if !ok {
		t.Fatal("socket not written raw")
	}
	var want bytes.Buffer
	got := make(chan []byte, 1)
	go func() {
		var buf bytes.Buffer
		p := make([]byte, 1000)
		for {
			time.Sleep(100 * time.Microsecond) // slower than the writer
			n, err := b.Read(p)
			buf.Write(p[:n])
			if err != nil {
				got <- buf.Bytes()
				return
			}
		}
	}()
	for i := range 300 {
		line := fmt.Sprintf("line %d %s\n", i, bytes.Repeat([]byte("y"), 2000))
		want.WriteString(line)
		l.line([]byte(line))
	}
	a.Close()
	if o.slow == 0 {
		t.Error("no write met a full socket buffer: the fallback went untested")
	}
	select {
	case g := <-got:
		if !bytes.Equal(g, want.Bytes()) {
			t.Fatalf("read %d bytes, want %d (first difference at %d)", len(g), want.Len(), firstDiff(g, want.Bytes()))
		}
	case <-time.After(20 * time.Second):
		t.Fatal("reader did not finish")
	}
}

func socketPair(t *testing.T) (*os.File, *os.File) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	return os.NewFile(uintptr(fds[0]), "sock-a"), os.NewFile(uintptr(fds[1]), "sock-b")
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
