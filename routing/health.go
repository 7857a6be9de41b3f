package routing

import (
	"context"
	"errors"
	"io"
	"net/http"
	"time"
)

// probeLoop probes b's health endpoint every health interval until ctx is
// done. FailAfter consecutive failures take b out of rotation; the next
// success brings it back (and wakes the admission queue). A probe that
// times out while b is still answering requests or sending events (since
// one interval before the probe) is excused: neither a failure nor a
// success. A backend busy with many streams may answer probes late; one
// that has stopped serving gets no excuse. Progress is stored at most once
// per progressGrain, so the stored time may lag the last event by up to
// that much: the window reaches back one grain further (without it, an
// interval shorter than the grain could refuse the excuse to a backend
// sending events every few milliseconds).
func (p *Pool) probeLoop(ctx context.Context, b *Backend) {
	defer p.wg.Done()
	hc := p.cfg.Health
	t := time.NewTicker(hc.Interval)
	defer t.Stop()
	fails := 0
	for {
		start := time.Now()
		ok, timedOut := p.probe(ctx, b)
		if ctx.Err() != nil {
			return
		}
		switch {
		case !ok && timedOut && b.progressAt.Load() >= start.Add(-hc.Interval-progressGrain).UnixNano():
			b.probeExcused.Add(1)
		case ok:
			fails = 0
			if b.probeDown.CompareAndSwap(true, false) {
				p.queue.signal()
			}
		default:
			b.probeFailures.Add(1)
			if fails++; fails >= hc.FailAfter && b.probeDown.CompareAndSwap(false, true) {
				b.probeEjections.Add(1)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// probe sends one health request; ok for a 2xx answer within the timeout.
// timedOut tells that the timeout ran out before the answer's headers.
func (p *Pool) probe(ctx context.Context, b *Backend) (ok, timedOut bool) {
	pctx, cancel := context.WithTimeout(ctx, p.cfg.Health.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(pctx, http.MethodGet, b.healthURL, nil)
	if err != nil {
		return false, false
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return false, ctx.Err() == nil && errors.Is(pctx.Err(), context.DeadlineExceeded)
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 300, false
}
