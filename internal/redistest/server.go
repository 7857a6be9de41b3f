package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ServerBinary and CLIBinary are the programs started. They can be
// overridden with the REDIS_SERVER and REDIS_CLI environment variables.
var (
	ServerBinary = envOr("REDIS_SERVER", "redis-server")
	CLIBinary    = envOr("REDIS_CLI", "redis-cli")
)

// startTimeout bounds how long a server may take to answer PING.
const startTimeout = 10 * time.Second

// Server is one private redis-server process on a loopback port.
// Its methods are safe for simultaneous use by multiple goroutines.
type Server struct {
	tb      testing.TB
	port    int
	dir     string
	args    []string // extra arguments (cluster mode)
	conf    string   // sentinel: the config file, run with --sentinel
	tlsPort int      // StartTLS: the TLS port beside the plain one

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
}

// Start starts a redis-server on a free loopback port with persistence off
// and stops it when the test ends. It fails the test if redis-server cannot
// be started.
func Start(tb testing.TB) *Server {
	tb.Helper()
	return start(tb, nil, false)
}

func start(tb testing.TB, extra []string, needBusPort bool) *Server {
	tb.Helper()
	var lastErr error
	for attempt := 0; attempt < 8; attempt++ {
		port, err := freePort(needBusPort)
		if err != nil {
			lastErr = err
			continue
		}
		s := &Server{tb: tb, port: port, dir: tb.TempDir(), args: extra}
		if err := s.launch(); err != nil {
			lastErr = err // most likely the port was taken meanwhile
			continue
		}
		tb.Cleanup(s.Stop)
		return s
	}
	tb.Fatalf("redistest: starting %s: %v", ServerBinary, lastErr)
	return nil
}

// Addr is the server's address, "127.0.0.1:port".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port is the server's TCP port.
func (s *Server) Port() int { return s.port }

// launch starts the process and waits until it answers PING.
func (s *Server) launch() error {
	args := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--protected-mode", "no",
		"--daemonize", "no",
		"--loglevel", "warning",
		"--logfile", filepath.Join(s.dir, "redis.log"),
	}
	args = append(args, s.args...)
	if s.conf != "" {
		args = append([]string{s.conf, "--sentinel"}, args...)
	}
	cmd := exec.Command(ServerBinary, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
	if err := waitPing(s.Addr(), exited); err != nil {
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("%w (log: %s)", err, s.logTail())
	}
	return nil
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	if len(b) > 400 {
		b = b[len(b)-400:]
	}
	return strings.TrimSpace(string(b))
}

// Kill ends the process with SIGKILL (no shutdown, no save) and waits for it.
func (s *Server) Kill() { s.signalAndWait(syscall.SIGKILL) }

// Stop ends the process (SIGKILL: persistence is off, so nothing is lost
// that a graceful shutdown would keep). It is safe to call more than once.
func (s *Server) Stop() { s.signalAndWait(syscall.SIGKILL) }

func (s *Server) signalAndWait(sig syscall.Signal) {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	<-exited
}

// Restart starts the server again on the same port (after Kill or Stop; a
// running server is killed first). The data set is empty afterwards.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Kill()
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		if err = s.launch(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond) // the port may linger briefly
	}
	s.tb.Fatalf("redistest: restarting on port %d: %v", s.port, err)
}

// Pause stops the process with SIGSTOP: connections are still accepted by
// the kernel but nothing is answered, as with a blackholed or stalled
// server. Resume undoes it; Stop works on a paused server.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server with SIGCONT.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(sig)
}

// Do sends one command to the server over a fresh connection and returns
// the reply as text (simple strings, errors with a "-" prefix, integers,
// bulk strings; arrays are joined with newlines). It is for test setup and
// assertions, not for load.
func (s *Server) Do(args ...string) (string, error) {
	return do(s.Addr(), args...)
}

func freePort(needBusPort bool) (int, error) {
	if !needBusPort {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("finding a free port: %w", err)
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port, nil
	}
	// Cluster nodes also listen on port+10000 (the cluster bus).
	for i := 0; i < 100; i++ {
		p := 20000 + rand.IntN(35000)
		if portFree(p) && portFree(p+10000) {
			return p, nil
		}
	}
	return 0, errors.New("no free port pair for a cluster node")
}

func portFree(p int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

func waitPing(addr string, exited <-chan struct{}) error {
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errors.New("redis-server exited at start")
		default:
		}
		if r, err := do(addr, "PING"); err == nil && r == "PONG" {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("no PING answer from %s within %v", addr, startTimeout)
}

// doTimeout bounds one command of do. It is generous: tests run beside
// other packages' tests on a small machine, where a redis-server may wait
// seconds for a CPU.
const doTimeout = 10 * time.Second

// do is a minimal RESP client: enough for PING, CLUSTER INFO and the like.
func do(addr string, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, doTimeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(doTimeout))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(c))
}

func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", err
		}
		parts := make([]string, 0, max(n, 0))
		for i := 0; i < n; i++ {
			p, err := readReply(r)
			if err != nil {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
