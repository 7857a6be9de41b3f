package proxy

import (
	"net/http"
	"net/url"
	"testing"
	"time"
)

// BenchmarkPipelineSteps times per-request steps of a small non-streamed
// request in isolation (small8): the stages a Record and Server-Timing
// carry, and the header copies both ways.
//
//	go test -run '^$' -bench BenchmarkPipelineSteps -benchmem ./proxy/
func BenchmarkPipelineSteps(b *testing.B) {
	t0 := time.Now()
	x := &exchange{r: &http.Request{Method: "POST", URL: &url.URL{Path: "/v1/chat/completions"}, Header: http.Header{}}}
	x.start, x.authDone, x.bodyRead, x.routed = t0, t0.Add(2*time.Microsecond), t0.Add(9*time.Microsecond), t0.Add(11*time.Microsecond)
	x.limited, x.admitted, x.picked = t0.Add(14*time.Microsecond), t0.Add(15*time.Microsecond), t0.Add(15*time.Microsecond)
	x.upstreamHeaders, x.firstToken = t0.Add(900*time.Microsecond), t0.Add(905*time.Microsecond)
	b.Run("record", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = x.record(t0.Add(time.Millisecond))
		}
	})
	b.Run("server-timing", func(b *testing.B) {
		var buf [256]byte
		b.ReportAllocs()
		for b.Loop() {
			_ = x.appendServerTiming(buf[:0])
		}
	})
	reqH := http.Header{"Content-Type": {"application/json"}, "Accept": {"*/*"}, "User-Agent": {"Go-http-client/1.1"},
		"Authorization": {"Bearer sk"}, "Content-Length": {"80"}, "Accept-Encoding": {"gzip"}, "Connection": {"keep-alive"},
		"X-Stainless-Lang": {"python"}}
	respH := http.Header{"Content-Type": {"application/json"}, "Date": {"Sat, 05 Dec 2026 15:00:00 GMT"},
		"Content-Length": {"300"}, "Server": {"uvicorn"}, "X-Request-Id": {"abc"}}
	b.Run("copy-request-header", func(b *testing.B) {
		dst := make(http.Header, 16)
		for b.Loop() {
			copyRequestHeader(dst, reqH)
			clear(dst)
		}
	})
	b.Run("copy-response-header", func(b *testing.B) {
		dst := make(http.Header, 16)
		for b.Loop() {
			copyResponseHeader(dst, respH)
			clear(dst)
		}
	})
}
