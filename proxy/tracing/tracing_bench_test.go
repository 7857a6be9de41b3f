package tracing

import (
	"context"
	"net/http"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-proxy/sluice/internal/otlptest"
)

// BenchmarkRequestTrace is one request's trace as the pipeline makes it
// (server span continuing a traceparent, one upstream CLIENT span injected
// into a header, seven stages, the same attributes), exported over
// OTLP/HTTP to an in-process receiver that only counts spans; the export is
// flushed every 128 requests and counted in the op. It reports the process
// CPU per request ("cpu-µs/req": the lean recorder, the protobuf encoding
// and HTTP, and the receiver's small share) with stages as events (the
// default), as child spans, without stage events (stage_events: false),
// and for a request the sampler leaves out (ratio 0; the pipeline then
// skips the attributes, here they are set all the same).
//
//	go test -run '^$' -bench BenchmarkRequestTrace -count 5 ./proxy/tracing/
func BenchmarkRequestTrace(b *testing.B) {
	url, spans := otlptest.StartCounting(b)
	for _, mode := range []string{"stage-events", "stage-spans", "no-stage-events", "sampled-out"} {
		b.Run(mode, func(b *testing.B) {
			ratio, events := 1.0, mode != "no-stage-events"
			if mode == "sampled-out" {
				ratio = 0
			}
			tr, err := New(context.Background(), Config{Enabled: true, Endpoint: url, SamplerRatio: &ratio, StageSpans: mode == "stage-spans", StageEvents: &events}, "bench")
			if err != nil {
				b.Fatal(err)
			}
			defer tr.Shutdown(context.Background())
			in := http.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
			if mode == "sampled-out" {
				in = http.Header{} // a trace Sluice starts, left out at ratio 0
			}
			stages := []string{"auth", "recv", "route", "limit", "queue", "prefill", "decode"}
			spans0 := spans.Load()
			b.ReportAllocs()
			cpu0 := cpuTime(b)
			for i := range b.N {
				t0 := time.Now()
				ctx, s := tr.StartServer(in, "POST", t0)
				c := tr.Start(ctx, "upstream", trace.SpanKindClient, t0, attribute.String("server.address", "127.0.0.1"),
					attribute.Int("sluice.attempt", 0), attribute.Int("server.port", 8000), attribute.String("sluice.pool", "p"))
				out := http.Header{}
				tr.Inject(c, out)
				c.AddEvent("first_token")
				c.SetAttributes(attribute.Int("http.response.status_code", 200), attribute.String("sluice.attempt.result", "relayed"))
				c.End()
				var marks [8]Mark
				for j, st := range stages {
					marks[j] = Mark{Name: st, Start: t0, End: t0}
				}
				marks[6].Attrs = []attribute.KeyValue{attribute.Int64("gen_ai.usage.output_tokens", 12)}
				tr.Stages(ctx, marks[:len(stages)])
				s.SetAttributes(attribute.String("http.request.method", "POST"), attribute.Int("http.response.status_code", 200),
					attribute.String("network.protocol.name", "h2"), attribute.String("client.address", "127.0.0.1"),
					attribute.String("sluice.request.id", "dd45d44c070330061797fd3b17d27a1f"), attribute.String("sluice.tenant.id", "t1"),
					attribute.String("sluice.server_timing", "auth;dur=0.046, recv;dur=0.054, route;dur=0.010, limit;dur=0.021, queue;dur=0.000, upstream;dur=0.531, prefill;dur=123.827, ttft;dur=124.481, edge;dur=0.069"),
					attribute.String("sluice.route", "main"), attribute.String("gen_ai.operation.name", "chat"),
					attribute.String("gen_ai.request.model", "sim-small"), attribute.Int64("gen_ai.request.max_tokens", 12),
					attribute.Int64("gen_ai.usage.input_tokens", 3), attribute.Int64("gen_ai.usage.output_tokens", 12),
					attribute.StringSlice("gen_ai.response.finish_reasons", []string{"stop"}))
				s.SetName("POST main")
				s.End()
				if i%128 == 127 { // 128 requests of 9 spans (stage spans) fit the queue of 2048
					tr.ForceFlush(context.Background())
				}
			}
			tr.ForceFlush(context.Background())
			b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/req")
			b.ReportMetric(float64(spans.Load()-spans0)/float64(b.N), "spans/req")
		})
	}
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
