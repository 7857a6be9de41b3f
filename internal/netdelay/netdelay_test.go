package netdelay

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"
)

// echo starts a line echo server on loopback.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn, r *bufio.Reader) (time.Duration, error) {
	t0 := time.Now()
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return 0, err
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := r.ReadString('\n')
	if err == nil && line != "ping\n" {
		err = io.ErrUnexpectedEOF
	}
	return time.Since(t0), err
}

// TestRelayDelaysAndPartitions checks a round trip takes at least twice
// the one-way delay, that a partition breaks open connections and refuses
// new ones, and that healing lets new connections through.
func TestRelayDelaysAndPartitions(t *testing.T) {
	r, err := Start(echo(t), 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	d, err := roundTrip(c, br)
	if err != nil || d < 100*time.Millisecond {
		t.Fatalf("round trip %v, %v; want at least 100ms", d, err)
	}

	r.Partition(true)
	if _, err := roundTrip(c, br); err == nil {
		t.Fatal("an open connection still answered across a partition")
	}
	c2, err := net.Dial("tcp", r.Addr())
	if err == nil {
		if _, err := roundTrip(c2, bufio.NewReader(c2)); err == nil {
			t.Fatal("a new connection answered across a partition")
		}
		c2.Close()
	}

	r.Partition(false)
	r.SetDelay(10 * time.Millisecond)
	c3, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if d, err := roundTrip(c3, bufio.NewReader(c3)); err != nil || d < 20*time.Millisecond {
		t.Fatalf("after healing: round trip %v, %v", d, err)
	}
}
