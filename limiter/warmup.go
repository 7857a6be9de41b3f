package limiter

import (
	"context"
	"errors"
	"runtime"
	"sync"

	"github.com/redis/go-redis/v9"
)

// The warm-up at start (NewFromConfig): without it a node's first
// admissions each dial a connection and meet NOSCRIPT (redis.Script's
// EVALSHA, then EVAL, which compiles the script), 60–310 ms for the first
// ones (docs/BENCHMARKS.md, gaps3).

// warmScripts are the scripts loaded at start: all this package runs.
var warmScripts = []*redis.Script{admitScript, settleScript, renewScript, statusScript, nodesScript, regionSyncScript}

// warmConns is how many connections the warm-up opens to each server:
// 2 per P (at least 4), at most the pool's size (go-redis' default pool is
// 10 per P).
func warmConns(poolSize int) int {
	n := max(4, 2*runtime.GOMAXPROCS(0))
	if poolSize <= 0 {
		poolSize = 10 * runtime.GOMAXPROCS(0)
	}
	return min(n, poolSize)
}

// warmUp opens conns connections to each server of c (simultaneous
// PINGs; the connections stay idle in the pool) and loads every script
// (SCRIPT LOAD, on every master of a cluster), within ctx. It returns the
// first failure; the pings go first, so a server that is down costs one
// dial.
func warmUp(ctx context.Context, c redis.UniversalClient, conns int) error {
	var err error
	if cc, ok := c.(*redis.ClusterClient); ok {
		err = cc.ForEachShard(ctx, func(ctx context.Context, shard *redis.Client) error {
			return pingN(ctx, shard, conns)
		})
	} else {
		err = pingN(ctx, c, conns)
	}
	if err != nil {
		return err
	}
	for _, s := range warmScripts {
		if err := s.Load(ctx, c).Err(); err != nil {
			return &scriptsError{err}
		}
	}
	return nil
}

// scriptsError is a warm-up whose connections opened but whose SCRIPT
// LOAD failed (an ACL user without +script|load: the scripts then load on
// their first use, by EVAL after NOSCRIPT).
type scriptsError struct{ err error }

func (e *scriptsError) Error() string { return "loading the scripts: " + e.err.Error() }
func (e *scriptsError) Unwrap() error { return e.err }

// pingN sends n PINGs at once: each takes its own connection from the
// pool, dialling it.
func pingN(ctx context.Context, c redis.Cmdable, n int) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.Ping(ctx).Err()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
