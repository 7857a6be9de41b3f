package limiter

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// renewBatch is the most leases renewed by one script call.
const renewBatch = 256

// Run is the node's heartbeat: every Heartbeat it renews all live leases in
// one pipeline (one renewal script per tenant scope, re-adding leases lost
// in a Redis restart), retries failed settles and registers the node in the
// live-node set. Every EpochPoll it checks the epochs of the scopes with
// leases and sends the queued settles; when the Redis behind the client
// changes (a failover, see resettle.go) it re-sends the recent settles.
// It returns when ctx is done, after Shutdown.
func (r *Redis) Run(ctx context.Context) error {
	tick := time.NewTicker(r.opt.Heartbeat)
	defer tick.Stop()
	poll := time.NewTicker(r.opt.EpochPoll)
	defer poll.Stop()
	again := time.NewTimer(resettleAgain) // the second resend pass
	again.Stop()
	defer again.Stop()
	_ = r.Beat(ctx)
	for {
		select {
		case <-ctx.Done():
			r.Shutdown(context.Background())
			return nil
		case <-tick.C:
			_ = r.Beat(ctx)
		case <-poll.C:
			pctx, cancel := context.WithTimeout(ctx, r.opt.EpochPoll)
			_ = r.pollEpochs(pctx)
			_ = r.sendPending(pctx)
			cancel()
		case <-r.watchChanges():
			r.resettle(ctx)
			again.Reset(resettleAgain)
		case <-again.C:
			r.resettle(ctx)
		}
	}
}

// shutdownTimeout bounds Shutdown's calls to Redis.
const shutdownTimeout = 2 * time.Second

// Shutdown leaves nothing of this node in Redis: it sends every queued
// settle and abandon now (a timed-out admission's undo, a settle that
// failed), settles the tickets still live at their charge (their leases are
// released; a later Settle of such a ticket does nothing) and leaves the
// live-node set. It is bounded by 2s; what Redis cannot take by then
// expires on its own (leases within LeaseTTL).
func (r *Redis) Shutdown(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	r.mu.Lock()
	var live []*Ticket
	for t := range r.live {
		live = append(live, t)
	}
	r.mu.Unlock()
	for _, t := range live {
		r.settleLater(t, Usage{InputTokens: t.ChargedInput, OutputTokens: t.ChargedOutput})
	}
	r.mu.Lock()
	pending := r.pending
	r.pending = nil
	r.mu.Unlock()
	calls := make([]*scriptCall, 0, len(pending)+1)
	for _, ps := range pending {
		calls = append(calls, r.settleCall(ps))
	}
	for len(calls) > 0 && ctx.Err() == nil {
		n := min(len(calls), 1000)
		_ = runPipeline(ctx, r.client, calls[:n])
		calls = calls[n:]
	}
	r.leave(ctx)
}

// Close does nothing; the caller owns the Redis client. Stop Run by
// cancelling its context.
func (r *Redis) Close() error { return nil }

// scriptCall is one script invocation in a pipeline.
type scriptCall struct {
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd
	scope  string // a renewal's scope prefix
}

// Beat performs one heartbeat now, bounded by Heartbeat. Run calls it; tests
// call it to renew at a chosen moment.
func (r *Redis) Beat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.opt.Heartbeat)
	defer cancel()
	calls := r.renewCalls()
	r.mu.Lock()
	pending := r.pending
	r.pending = nil
	r.mu.Unlock()
	nodes := &scriptCall{script: nodesScript, keys: []string{nodesKey},
		args: []any{r.opt.NodeID, (3 * r.opt.Heartbeat).Microseconds()}}
	calls = append(calls, nodes)
	settles := make([]*scriptCall, len(pending))
	for i, ps := range pending {
		settles[i] = r.settleCall(ps)
	}
	err := runPipeline(ctx, r.client, append(calls, settles...))
	r.noteRenewEpochs(calls)
	if n, e := nodes.cmd.Int64(); e == nil {
		r.nodes.Store(n)
	}
	r.requeue(pending, settles)
	return err
}

// sendPending sends the queued settles now. Run calls it every EpochPoll,
// so that a settle queued while Redis was away (a timeout, the breaker
// open) reaches it soon after it answers again (a new master after a
// failover), not up to a Heartbeat later while its lease holds a slot.
// Without queued settles it does nothing.
func (r *Redis) sendPending(ctx context.Context) error {
	r.mu.Lock()
	pending := r.pending
	r.pending = nil
	r.mu.Unlock()
	if len(pending) == 0 {
		return nil
	}
	settles := make([]*scriptCall, len(pending))
	for i, ps := range pending {
		settles[i] = r.settleCall(ps)
	}
	err := runPipeline(ctx, r.client, settles)
	r.requeue(pending, settles)
	return err
}

// requeue keeps failed settles for the next beat, for up to twice LeaseTTL
// (after that the admission record is gone and the lease expired).
func (r *Redis) requeue(pending []pendingSettle, calls []*scriptCall) {
	var again []pendingSettle
	for i, ps := range pending {
		if err := calls[i].cmd.Err(); err != nil && err != redis.Nil {
			if time.Since(ps.since) < r.recordTTL() {
				again = append(again, ps)
			}
		} else {
			r.recordSent(ps)
		}
	}
	if len(again) > 0 {
		r.mu.Lock()
		r.pending = append(r.pending, again...)
		r.mu.Unlock()
	}
}

// renewCalls groups the live leases by scope, renewBatch per call.
func (r *Redis) renewCalls() []*scriptCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	byScope := make(map[string]*scriptCall)
	var calls []*scriptCall
	ttl, rttl := r.opt.LeaseTTL.Microseconds(), r.recordTTL().Milliseconds()
	grace, ettl := r.opt.epochGrace().Microseconds(), epochKeyTTL.Milliseconds()
	for t := range r.live {
		pre := scopePrefix(t.Tenant, t.Model, t.plan.scoped)
		c := byScope[pre]
		if c == nil || len(c.keys) > renewBatch {
			c = &scriptCall{script: renewScript, keys: []string{pre + ":c", pre + ":e"},
				args: []any{ttl, rttl, grace, ettl}, scope: pre}
			byScope[pre] = c
			calls = append(calls, c)
		}
		c.keys = append(c.keys, recordKey(t.Tenant, t.ID))
		c.args = append(c.args, t.ID,
			strconv.FormatInt(t.ChargedInput, 10)+" "+strconv.FormatInt(t.ChargedOutput, 10))
	}
	return calls
}

// runPipeline sends calls with EVALSHA in one pipeline, then resends any
// that failed with NOSCRIPT with EVAL.
func runPipeline(ctx context.Context, c Client, calls []*scriptCall) error {
	pipe := c.Pipeline()
	for _, sc := range calls {
		sc.cmd = sc.script.EvalSha(ctx, pipe, sc.keys, sc.args...)
	}
	_, err := pipe.Exec(ctx)
	var retry []*scriptCall
	for _, sc := range calls {
		if errNoScript(sc.cmd.Err()) {
			retry = append(retry, sc)
		}
	}
	if len(retry) == 0 {
		return pipelineErr(err)
	}
	pipe = c.Pipeline()
	for _, sc := range retry {
		sc.cmd = sc.script.Eval(ctx, pipe, sc.keys, sc.args...)
	}
	_, err = pipe.Exec(ctx)
	return pipelineErr(err)
}

func pipelineErr(err error) error {
	if err == nil || err == redis.Nil {
		return nil
	}
	return fmt.Errorf("heartbeat pipeline: %w", err)
}

// leave removes this node from the live-node set (best effort).
func (r *Redis) leave(ctx context.Context) {
	pipe := r.client.Pipeline()
	pipe.ZRem(ctx, nodesKey, r.opt.NodeID)
	_, _ = pipe.Exec(ctx)
}
