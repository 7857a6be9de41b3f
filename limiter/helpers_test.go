package limiter

import (
	"context"
	"fmt"
	"math"
	"os"
	"sync"
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

// These tests share a 2-core machine with other packages' tests running
// at the same time (go test ./... runs packages in parallel), so a
// goroutine, or redis-server, may wait hundreds of milliseconds for a CPU.
// Two rules follow:
//
//   - A test of the shared (Redis) path gives the store generous timeouts
//     (storeTimeout), so a starved CPU cannot turn a shared decision into a
//     degraded one. Only tests of degraded mode use short timeouts, against
//     a Redis that is really down or paused.
//   - A bound that depends on time (a bucket refilling, a Retry-After
//     shrinking) is computed from the time the test measured around the
//     calls, not from how long they "should" take.
const storeTimeout = 20 * time.Second

func TestMain(m *testing.M) {
	// go-redis logs every failed dial on its global logger: tests that
	// kill, pause or restart Redis produce pages of it. Failures reach the
	// tests as errors, which they check.
	redis.SetLogger(discardLogger{})
	os.Exit(m.Run())
}

type discardLogger struct{}

func (discardLogger) Printf(context.Context, string, ...any) {}

var idSeq atomic.Int64

func nextID() string { return fmt.Sprintf("req-%d", idSeq.Add(1)) }

func newClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true,
		DialTimeout: storeTimeout, ReadTimeout: storeTimeout, WriteTimeout: storeTimeout})
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

// refill is how many units a bucket of perMinute can have refilled since
// since (rounded up): the slack of an assertion on a Remaining or
// Retry-After read some unknown time after since.
func refill(perMinute float64, since time.Time) int64 {
	return int64(math.Ceil(perMinute / 60 * time.Since(since).Seconds()))
}

// fakeClock is a Shared's clock in degraded-mode tests: the breaker's
// cooldown passes only when the test says so.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Now()} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
