package routing

import (
	"context"
	"io"
	"net/http"
	"time"
)

// probeLoop probes b's health endpoint every health interval until ctx is
// done. FailAfter consecutive failures take b out of rotation; the next
// success brings it back (and wakes the admission queue).
func (p *Pool) probeLoop(ctx context.Context, b *Backend) {
	defer p.wg.Done()
	hc := p.cfg.Health
	t := time.NewTicker(hc.Interval)
	defer t.Stop()
	fails := 0
	for {
		ok := p.probe(ctx, b)
		if ctx.Err() != nil {
			return
		}
		if ok {
			fails = 0
			if b.probeDown.CompareAndSwap(true, false) {
				p.queue.signal()
			}
		} else {
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

// probe sends one health request; true for a 2xx answer within the
// timeout.
func (p *Pool) probe(ctx context.Context, b *Backend) bool {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Health.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.healthURL, nil)
	if err != nil {
		return false
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return false
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 300
}
