// Package tracing wraps the OpenTelemetry Go SDK for Sluice's request
// traces: one SERVER span per request continuing the client's W3C
// traceparent/tracestate (or starting a trace), its stages as events on
// it (or child spans) and a CLIENT span per upstream attempt, exported over OTLP (HTTP/protobuf
// or gRPC) by a batch span processor. HTTP/protobuf export encodes the
// spans straight to the wire format (wire.go) rather than through
// otlptracehttp's protobuf structs. See docs/TIMING.md and
// docs/CONFIG.md ("tracing").
//
// A nil *Tracer is tracing off: the pipeline checks for nil and does
// nothing else, so tracing costs nothing when it is off.
package tracing
