package redistest

import (
	"net"
	"strings"
	"testing"
	"time"
)

func TestServerLifecycle(t *testing.T) {
	t.Parallel()
	s := Start(t)
	if _, err := s.Do("SET", "k", "v"); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if got, _ := s.Do("GET", "k"); got != "v" {
		t.Fatalf("GET k = %q; want %q", got, "v")
	}
	if got, _ := s.Do("CONFIG", "GET", "save"); got != "save\n" {
		t.Fatalf("CONFIG GET save = %q; want persistence off", got)
	}

	addr := s.Addr()
	s.Kill()
	if _, err := s.Do("PING"); err == nil {
		t.Fatal("PING answered after Kill")
	}
	s.Restart()
	if s.Addr() != addr {
		t.Fatalf("Restart moved the server: %s -> %s", addr, s.Addr())
	}
	if got, _ := s.Do("GET", "k"); got != "" {
		t.Fatalf("GET k after restart = %q; want empty data set", got)
	}
}

func TestServerPause(t *testing.T) {
	t.Parallel()
	s := Start(t)
	s.Pause()
	c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		t.Fatalf("dial paused server: %v (the kernel should still accept)", err)
	}
	_, _ = c.Write([]byte("*1\r\n$4\r\nPING\r\n"))
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	buf := make([]byte, 16)
	if n, err := c.Read(buf); err == nil {
		t.Fatalf("paused server answered %q", buf[:n])
	}
	s.Resume()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "+PONG\r\n" {
		t.Fatalf("after Resume read %q, %v; want +PONG", buf[:n], err)
	}
	c.Close()
}

func TestCluster(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 3)
	if len(c.Addrs()) != 3 {
		t.Fatalf("Addrs() = %v; want 3", c.Addrs())
	}
	info, err := c.Servers[0].Do("CLUSTER", "INFO")
	if err != nil || !strings.Contains(info, "cluster_slots_assigned:16384") {
		t.Fatalf("CLUSTER INFO = %q, %v; want all slots assigned", info, err)
	}
}

func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	ss := StartSentinel(t)
	if got, err := ss.MasterAddr(); err != nil || got != ss.Master.Addr() {
		t.Fatalf("MasterAddr() = %q, %v; want %s", got, err, ss.Master.Addr())
	}
	if _, err := ss.Master.Do("SET", "k", "v"); err != nil {
		t.Fatalf("SET: %v", err)
	}
	now := ss.Failover()
	if now != ss.Replica {
		t.Fatalf("new master %s; want the replica %s", now.Addr(), ss.Replica.Addr())
	}
	if got, _ := now.Do("GET", "k"); got != "v" {
		t.Fatalf("GET k on the new master = %q; want the replicated %q", got, "v")
	}
	if _, err := now.Do("SET", "k2", "v"); err != nil {
		t.Fatalf("SET on the new master: %v", err)
	}
}

func TestSentinelTLSFailover(t *testing.T) {
	t.Parallel()
	ss := StartSentinelTLS(t, WriteTLSFiles(t))
	if got, err := ss.MasterAddr(); err != nil || got != ss.Master.TLSAddr() {
		t.Fatalf("MasterAddr() = %q, %v; want the TLS address %s", got, err, ss.Master.TLSAddr())
	}
	if now := ss.Failover(); now != ss.Replica {
		t.Fatalf("new master %s; want the replica", now.Addr())
	}
	if got, _ := ss.MasterAddr(); got != ss.Replica.TLSAddr() {
		t.Fatalf("MasterAddr() after the failover = %q; want %s", got, ss.Replica.TLSAddr())
	}
}
