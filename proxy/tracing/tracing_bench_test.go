package tracing

import (
	"context"
	"net/http"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-proxy/sluice/internal/otlptest"
)

// BenchmarkRequestTrace is one request's trace as the pipeline makes it,
// exported over OTLP/HTTP to an in-process counting receiver (the export
// flushed every 512 requests and counted in the op): stage child spans
// ("spans") or stage events on the server span ("events").
func BenchmarkRequestTrace(b *testing.B) {
	url, _ := otlptest.StartCounting(b)
	ratio := 1.0
	tr, err := New(context.Background(), Config{Enabled: true, Endpoint: url, SamplerRatio: &ratio}, "bench")
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Shutdown(context.Background())
	h := http.Header{}
	stages := []string{"auth", "recv", "route", "limit", "queue", "prefill", "decode"}
	for _, mode := range []string{"spans", "events"} {
		b.Run(mode, func(b *testing.B) {
			b.ReportAllocs()
			for i := range b.N {
				t0 := time.Now()
				ctx, s := tr.StartServer(h, "POST", t0)
				c := tr.Start(ctx, "upstream", trace.SpanKindClient, t0, attribute.String("server.address", "127.0.0.1"), attribute.Int("sluice.attempt", 0))
				tr.Inject(c, h)
				c.End()
				for _, st := range stages {
					if mode == "spans" {
						tr.Span(ctx, st, t0, t0)
					} else {
						s.AddEvent(st, trace.WithTimestamp(t0))
					}
				}
				s.SetAttributes(attribute.String("gen_ai.request.model", "m"), attribute.Int64("gen_ai.usage.input_tokens", 3),
					attribute.Int64("gen_ai.usage.output_tokens", 12), attribute.String("sluice.tenant.id", "t1"))
				s.End()
				if i%512 == 511 {
					tr.ForceFlush(context.Background())
				}
			}
			tr.ForceFlush(context.Background())
		})
	}
}
