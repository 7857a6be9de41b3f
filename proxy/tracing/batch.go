package tracing

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
)

// exportQueue is the lean recorder's batch span processor. A span is
// encoded when it ends (the Span message, wire.go) into a bounded buffer
// of bytes that one goroutine, owned by the Tracer and stopped by
// Shutdown, takes whole and posts; the span's record goes straight back to
// a small free list. So the queue holds no pointers for the GC to scan,
// and only the spans in progress hold records. Pushing takes a short lock
// and never blocks on the export: a span that finds the queue full is
// dropped and counted (Dropped, and an error to otel.Handle, which the
// node logs). The goroutine is woken only when a batch is full, at the
// schedule delay, or to flush: not per span, as the SDK's channel does.
// Sizes and delays are the SDK's, from the same OTEL_BSP_* variables.
type exportQueue struct {
	exp       *wireExporter
	res       *resource.Resource // of every span
	scope     instrumentation.Scope
	maxQueue  int // spans
	batchSize int // spans per export
	delay     time.Duration
	timeout   time.Duration

	mu     sync.Mutex
	q      encoded
	free   []*record // records to reuse, at most maxFree
	closed bool

	kick    chan struct{}      // a batch is full (capacity 1: wakes once)
	flushes chan chan struct{} // ForceFlush: closed when the queue was exported
	stop    chan struct{}      // closed by Shutdown
	done    chan struct{}      // closed when the goroutine ends

	dropped  atomic.Uint64
	reported uint64 // dropped as of the last report; the goroutine's
}

// encoded are encoded spans: each a ScopeSpans.spans field, ends[i] the
// end of span i in buf.
type encoded struct {
	buf  []byte
	ends []int
}

// maxFree bounds the free list: records are held only from a span's start
// to its end, so a few per request in progress.
const maxFree = 256

// envInt reads a positive integer variable, else def.
func envInt(k string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil && v > 0 {
		return v
	}
	return def
}

// newExportQueue starts the queue's goroutine exporting to exp.
func newExportQueue(exp *wireExporter, res *resource.Resource, scope instrumentation.Scope) *exportQueue {
	q := &exportQueue{
		exp:       exp,
		res:       res,
		scope:     scope,
		maxQueue:  envInt("OTEL_BSP_MAX_QUEUE_SIZE", 2048),
		batchSize: envInt("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512),
		delay:     time.Duration(envInt("OTEL_BSP_SCHEDULE_DELAY", 5000)) * time.Millisecond,
		timeout:   time.Duration(envInt("OTEL_BSP_EXPORT_TIMEOUT", 30000)) * time.Millisecond,
		kick:      make(chan struct{}, 1),
		flushes:   make(chan chan struct{}),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	q.batchSize = min(q.batchSize, q.maxQueue) // as the SDK
	go q.run()
	return q
}

// push encodes an ended span's record and queues the bytes, or drops them
// when the queue is full or shut down; the record goes back to the free
// list either way (unless it holds maxFree).
func (q *exportQueue) push(r *record) {
	b, at := open(r.enc[:0], fSSSpans)
	enc := closeAt(appendSpan(b, r), at)
	r.reset() // before the lock: one critical section per span for the queue and the free list (handlers contend for it)
	r.enc = enc
	q.mu.Lock()
	full := false
	if q.closed || len(q.q.ends) >= q.maxQueue {
		if !q.closed { // after Shutdown spans are not exported, as with the SDK
			q.dropped.Add(1)
		}
	} else {
		q.q.buf = append(q.q.buf, enc...)
		q.q.ends = append(q.q.ends, len(q.q.buf))
		full = len(q.q.ends) == q.batchSize
	}
	if len(q.free) < maxFree {
		q.free = append(q.free, r)
	}
	q.mu.Unlock()
	if full {
		select {
		case q.kick <- struct{}{}:
		default:
		}
	}
}

// get returns a record from the free list, else a new one. A free list
// of its own rather than a sync.Pool: the pool is emptied by every GC,
// which on a busy proxy is often enough to make each span allocate its
// record again.
func (q *exportQueue) get() *record {
	q.mu.Lock()
	if n := len(q.free); n > 0 {
		r := q.free[n-1]
		q.free[n-1] = nil
		q.free = q.free[:n-1]
		q.mu.Unlock()
		return r
	}
	q.mu.Unlock()
	return newRecord()
}

// run is the export goroutine: it exports what is queued when a batch is
// full, at the schedule delay, on a flush, and at the stop.
func (q *exportQueue) run() {
	defer close(q.done)
	var spare encoded
	t := time.NewTimer(q.delay)
	defer t.Stop()
	for {
		select {
		case <-q.kick:
		case <-t.C:
		case ch := <-q.flushes:
			spare = q.exportAll(spare)
			close(ch)
			continue
		case <-q.stop:
			q.exportAll(spare)
			return
		}
		spare = q.exportAll(spare)
		t.Reset(q.delay)
	}
}

// exportAll takes the queued spans (leaving spare as the new buffer),
// posts them in batches and gives back the taken buffer as the next
// spare.
func (q *exportQueue) exportAll(spare encoded) encoded {
	q.mu.Lock()
	taken := q.q
	q.q = encoded{buf: spare.buf[:0], ends: spare.ends[:0]}
	q.mu.Unlock()
	from := 0
	for i := 0; i < len(taken.ends); i += q.batchSize {
		last := taken.ends[min(i+q.batchSize, len(taken.ends))-1]
		ctx, cancel := context.WithTimeout(context.Background(), q.timeout)
		if err := q.exp.exportEncoded(ctx, taken.buf[from:last], q.res, q.scope); err != nil {
			otel.Handle(err)
		}
		cancel()
		from = last
	}
	if d := q.dropped.Load(); d != q.reported {
		otel.Handle(fmt.Errorf("tracing: %d spans dropped: the export queue (%d spans) was full", d-q.reported, q.maxQueue))
		q.reported = d
	}
	return taken
}

// flush exports what is queued now, waiting for it up to ctx.
func (q *exportQueue) flush(ctx context.Context) error {
	ch := make(chan struct{})
	select {
	case q.flushes <- ch:
	case <-q.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// shutdown stops taking records, exports those queued and ends the
// goroutine, waiting for it up to ctx.
func (q *exportQueue) shutdown(ctx context.Context) error {
	q.mu.Lock()
	already := q.closed
	q.closed = true
	q.mu.Unlock()
	if !already {
		close(q.stop)
	}
	select {
	case <-q.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
