package limiter

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/redistest"
)

// TestWarmUpAtStart: NewFromConfig returns with every script loaded on
// the server (SCRIPT EXISTS) and warmConns connections open, so that the
// first admissions need not dial nor meet NOSCRIPT; Warm reports it.
func TestWarmUpAtStart(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s, err := NewFromConfig(RedisConfig{Addrs: []string{srv.Addr()}, AdmissionTimeout: storeTimeout,
		DialTimeout: storeTimeout, ReadTimeout: storeTimeout, WriteTimeout: storeTimeout}, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Warm() {
		t.Fatal("Warm() false with Redis up")
	}
	args := []string{"SCRIPT", "EXISTS"}
	for _, sc := range warmScripts {
		args = append(args, sc.Hash())
	}
	got, err := srv.Do(args...)
	if want := strings.TrimSuffix(strings.Repeat("1\n", len(warmScripts)), "\n"); err != nil || got != want {
		t.Fatalf("SCRIPT EXISTS: %q, %v; want every script loaded (%q)", got, err, want)
	}
	before := clients(t, srv)
	if want := warmConns(0); before < want {
		t.Fatalf("%d connections open after the warm-up; want %d", before, want)
	}
	d := admit(t, s, Request{Tenant: "warm", Limits: Limits{MaxConcurrency: 1}})
	if !d.Allowed || d.Degraded {
		t.Fatalf("decision %+v; want a shared admission", d)
	}
	settle(t, s, d.Ticket, Usage{})
}

// clients is the number of the server's client connections but the one
// asking.
func clients(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	list, err := srv.Do("CLIENT", "LIST")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(strings.TrimSpace(list), "\n") // lines minus this one
}

// TestWarmUpRedisDown: with Redis down (a port nobody listens on) the
// warm-up fails at once, NewFromConfig returns within its bound (dial
// timeout + read timeout) with Warm false, and admissions are decided by
// the store-failure policy.
func TestWarmUpRedisDown(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	const dial, read = time.Second, 500 * time.Millisecond
	start := time.Now()
	s, err := NewFromConfig(RedisConfig{Addrs: []string{addr}, DialTimeout: dial, ReadTimeout: read,
		AdmissionTimeout: storeTimeout}, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if took := time.Since(start); took > dial+read+time.Second {
		t.Fatalf("NewFromConfig took %v with Redis down; want at most the dial and read timeouts", took)
	}
	if s.Warm() {
		t.Fatal("Warm() true with Redis down")
	}
	d, err := s.Admit(context.Background(), Request{Tenant: "down", Limits: Limits{MaxConcurrency: 1}})
	if err != nil || !d.Degraded {
		t.Fatalf("decision %+v, %v; want a degraded decision", d, err)
	}
}
