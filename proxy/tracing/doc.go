// Package tracing makes Sluice's request traces: one SERVER span per
// request continuing the client's W3C traceparent/tracestate (or starting
// a trace), its stages as events on it (or child spans) and a CLIENT span
// per upstream attempt, exported over OTLP (HTTP/protobuf or gRPC).
//
// Over OTLP/HTTP the spans are recorded by a lean recorder of its own
// (span.go: pooled records with the SDK's semantics, batch.go: a bounded
// export queue drained by one goroutine) and encoded straight to the
// protobuf wire format (wire.go), at about a third of the OpenTelemetry
// SDK's CPU per request; TestLeanMatchesSDK checks that the exports are
// the SDK's, byte for byte. OTLP/gRPC, otlptracehttp's fallbacks (TLS
// files, compression, the default endpoint), OTEL_TRACES_SAMPLER and the
// span-limit variables keep the SDK (and its batch span processor). See
// docs/TIMING.md ("Traces") and docs/CONFIG.md ("tracing").
//
// A nil *Tracer is tracing off: the pipeline checks for nil and does
// nothing else, so tracing costs nothing when it is off.
package tracing
