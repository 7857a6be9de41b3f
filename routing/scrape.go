package routing

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// maxExposition bounds the metrics body read from a backend.
const maxExposition = 8 << 20

// The probe client's idle pool: a scrape and a probe per backend at most.
const (
	probeIdleConns   = 2
	probeIdleTimeout = 30 * time.Second
)

// newProbeClient is the HTTP client for scrapes and health probes: a few
// kept-alive connections per backend, no proxy from the environment.
func newProbeClient() *http.Client {
	d := &net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         d.DialContext,
		MaxIdleConnsPerHost: probeIdleConns,
		IdleConnTimeout:     probeIdleTimeout,
	}}
}

// scrapeLoop reads b's metrics every scrape interval until ctx is done.
func (p *Pool) scrapeLoop(ctx context.Context, b *Backend) {
	defer p.wg.Done()
	var buf bytes.Buffer
	t := time.NewTicker(p.cfg.ScrapeInterval)
	defer t.Stop()
	for {
		if err := p.scrape(ctx, b, &buf); err != nil && ctx.Err() == nil {
			b.scrapeErrors.Add(1)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// scrape reads b's metrics once and stores the sample. A failed scrape
// stores nothing: the previous sample ages until it is stale.
func (p *Pool) scrape(ctx context.Context, b *Backend, buf *bytes.Buffer) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.StaleAfter)
	defer cancel()
	at, inflight := time.Now(), b.inflight.Load()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.metricsURL, nil)
	if err != nil {
		return fmt.Errorf("scraping %s: %w", b.metricsURL, err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := p.client.Do(req)
	if err != nil {
		return fmt.Errorf("scraping %s: %w", b.metricsURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		return fmt.Errorf("scraping %s: status %d", b.metricsURL, resp.StatusCode)
	}
	buf.Reset()
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, maxExposition+1)); err != nil {
		return fmt.Errorf("scraping %s: %w", b.metricsURL, err)
	}
	if buf.Len() > maxExposition {
		return fmt.Errorf("scraping %s: metrics larger than %d bytes", b.metricsURL, maxExposition)
	}
	s, err := parseGauges(buf.Bytes(), b.Config.Dialect)
	if err != nil {
		return fmt.Errorf("scraping %s: %w", b.metricsURL, err)
	}
	s.At, s.inflight = at, inflight
	b.scraped.Store(&s)
	p.queue.signal()
	return nil
}
