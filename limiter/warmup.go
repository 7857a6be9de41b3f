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

// warmUp opens conns connections to each server of c (pingN; the
// connections stay idle in the pool) and loads every script
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

// pingN opens n connections, dialling each with a PING. On a
// *redis.Client (a single server, a failover client, a cluster's shard)
// the PINGs go one after the other, each holding its connection
// (Client.Conn) until all are done, so that n connections are open
// afterwards (overlapping PINGs could take a connection another had just
// put back, and open fewer: seen under load, 3 of 4), and a server that
// is down costs one dial. One after the other because go-redis v9.23
// races on its options when Conns of one client are first used at once
// (initConn's maintenance-notifications fallback). Other clients (a
// ring) get n overlapping PINGs.
func pingN(ctx context.Context, c redis.Cmdable, n int) error {
	if rc, ok := c.(*redis.Client); ok {
		conns := make([]*redis.Conn, 0, n)
		defer func() {
			for _, cn := range conns {
				cn.Close() // back to the pool, open
			}
		}()
		for range n {
			cn := rc.Conn()
			conns = append(conns, cn)
			if err := cn.Ping(ctx).Err(); err != nil {
				return err
			}
		}
		return nil
	}
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
