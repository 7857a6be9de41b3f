package h1up

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
)

// The held-stream benchmark measures what an open, idle stream costs the
// client: memory (heap and stacks) and goroutines. Its backend runs in a
// child process (this test binary, re-run with heldBackendEnv set), so
// that everything the benchmark process holds is the client's.
const heldBackendEnv = "H1UP_HELD_BACKEND"

func TestMain(m *testing.M) {
	if os.Getenv(heldBackendEnv) != "" {
		heldBackend()
		return
	}
	if os.Getenv("SLUICE_H1UP_SENDWAIT") != "0" {
		sendWaitOn = true // the tests run the opt-in path unless told not to
	}
	os.Exit(m.Run())
}

// heldBackend answers each request with a stream's head and first event
// and then holds it, until its stdin closes. It prints its address first.
func heldBackend() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr().String())
	go func() {
		io.Copy(io.Discard, os.Stdin) // the parent's end
		os.Exit(0)
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			os.Exit(0)
		}
		go func() {
			br := bufio.NewReader(c)
			if _, err := http.ReadRequest(br); err != nil {
				c.Close()
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+
				"d\r\ndata: first\n\n\r\n")
			io.Copy(io.Discard, c) // hold until the client closes
			c.Close()
		}()
	}
}

func startHeldBackend(b *testing.B) string {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), heldBackendEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.HasPrefix(line, "error") {
		b.Fatalf("held backend: %q, %v", line, err)
	}
	return "http://" + strings.TrimSpace(line)
}

// BenchmarkHeldStreams opens 2,000 streams, reads each one's first event
// and holds them: bytes/stream is the heap and stack the client keeps per
// idle stream, goroutines/stream its goroutines. "h1up-detached" holds
// the connections after Detach, as the event loop would (the socket and
// its unread bytes only). One op is the whole set.
//
//	go test -run '^$' -bench HeldStreams -benchtime 1x -count 3 ./proxy/h1up/
func BenchmarkHeldStreams(b *testing.B) {
	const streams = 2000
	url := startHeldBackend(b)
	for _, bc := range []struct {
		name   string
		rt     func() http.RoundTripper
		detach bool
	}{
		{"h1up", func() http.RoundTripper { return New(Options{}) }, false},
		{"h1up-detached", func() http.RoundTripper { return New(Options{}) }, true},
		{"nethttp", func() http.RoundTripper { return netHTTPTransport() }, false},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for range b.N {
				heldRound(b, url, bc.rt(), bc.detach, streams)
			}
		})
	}
}

func heldRound(b *testing.B, url string, rt http.RoundTripper, detach bool, streams int) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()
	bodies := make([]io.ReadCloser, 0, streams)
	conns := make([]net.Conn, 0, streams)
	raws := make([][]byte, 0, streams)
	buf := make([]byte, 4<<10) // as the proxy reads: into a buffer of its own
	for range streams {
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"stream":true}`))
		resp, err := rt.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadAtLeast(resp.Body, buf, len("data: first\n\n")); err != nil {
			b.Fatal(err)
		}
		if detach {
			conn, raw, _, _, err := resp.Body.(*Body).Detach()
			if err != nil {
				b.Fatal(err)
			}
			conns, raws = append(conns, conn), append(raws, raw)
			continue
		}
		bodies = append(bodies, resp.Body)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	g1 := runtime.NumGoroutine()
	held := float64(after.HeapInuse+after.StackInuse) - float64(before.HeapInuse+before.StackInuse)
	b.ReportMetric(held/float64(streams), "bytes/stream")
	b.ReportMetric(float64(g1-g0)/float64(streams), "goroutines/stream")
	for _, body := range bodies {
		body.Close()
	}
	for _, c := range conns {
		c.Close()
	}
	runtime.KeepAlive(raws)
	rt.(interface{ CloseIdleConnections() }).CloseIdleConnections()
}
