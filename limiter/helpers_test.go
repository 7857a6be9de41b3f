package limiter

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-proxy/sluice/internal/redistest"
)

// snapshotter is what the usage endpoint needs; every implementation has it.
type snapshotter interface {
	Limiter
	Snapshot(ctx context.Context, tenant string, l Limits) (Status, error)
}

var idSeq atomic.Int64

func nextID() string { return fmt.Sprintf("req-%d", idSeq.Add(1)) }

func newClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true,
		DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
	t.Cleanup(func() { c.Close() })
	return c
}

func newRedis(t testing.TB, addr string, opt RedisOptions) *Redis {
	t.Helper()
	return NewRedis(newClient(t, addr), opt)
}

func ptr[T any](v T) *T { return &v }

func admit(t testing.TB, l Limiter, req Request) Decision {
	t.Helper()
	if req.ID == "" {
		req.ID = nextID()
	}
	d, err := l.Admit(context.Background(), req)
	if err != nil {
		t.Fatalf("Admit(%+v): %v", req, err)
	}
	return d
}

func settle(t testing.TB, l Limiter, tk *Ticket, u Usage) {
	t.Helper()
	if err := l.Settle(context.Background(), tk, u); err != nil {
		t.Fatalf("Settle: %v", err)
	}
}

func snapshot(t testing.TB, l snapshotter, tenant string, lim Limits) Status {
	t.Helper()
	st, err := l.Snapshot(context.Background(), tenant, lim)
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	return st
}

// within fails unless got is in [lo, hi].
func within[T int64 | time.Duration](t testing.TB, what string, got, lo, hi T) {
	t.Helper()
	if got < lo || got > hi {
		t.Errorf("%s = %v; want in [%v, %v]", what, got, lo, hi)
	}
}

// startRedis starts a private server for one test.
func startRedis(t testing.TB) *redistest.Server { return redistest.Start(t) }
