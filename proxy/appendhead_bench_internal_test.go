package proxy

import (
	"net/http"
	"testing"
	"time"
)

// BenchmarkAppendHead is the h1 hand-off's head for a typical streamed
// answer (the backend's fields, Server-Timing, the rate-limit fields, the
// request ids): the bytes of its first write before the first event.
func BenchmarkAppendHead(b *testing.B) {
	h := http.Header{
		"Cache-Control":                  {"no-cache"},
		"Content-Type":                   {"text/event-stream"},
		"Server-Timing":                  {"net-rtt;dur=0.018, auth;dur=0.007, recv;dur=0.005, route;dur=0.046, limit;dur=0.000, queue;dur=0.000, upstream;dur=0.220, prefill;dur=0.006, ttft;dur=0.287, edge;dur=0.056"},
		"Trailer":                        {"Server-Timing"},
		"X-Accel-Buffering":              {"no"},
		"X-Ratelimit-Limit-Requests":     {"100000000"},
		"X-Ratelimit-Remaining-Requests": {"99999999"},
		"X-Ratelimit-Limit-Tokens":       {"2000000000"},
		"X-Ratelimit-Remaining-Tokens":   {"1999999900"},
		"X-Request-Id":                   {"78ea83619db08b95ebc0b1fc371fc33a"},
		"X-Sluice-Region":                {"bench"},
		"X-Sluice-Request-Id":            {"78ea83619db08b95ebc0b1fc371fc33a"},
	}
	now := time.Now()
	buf := make([]byte, 0, 2048)
	b.ReportAllocs()
	for b.Loop() {
		buf = appendHead(buf[:0], h, now, true, false)
	}
}
