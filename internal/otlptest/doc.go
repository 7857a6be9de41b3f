// Package otlptest is an in-process OTLP trace receiver for tests: an
// HTTP endpoint (POST /v1/traces, binary protobuf, optionally gzip) and a
// gRPC TraceService, both on 127.0.0.1, decoding the real
// ExportTraceServiceRequest protobuf (go.opentelemetry.io/proto/otlp
// v1.11.0, the version the OpenTelemetry Go exporters v1.47.0 send) as an
// OpenTelemetry Collector's otlp receiver does (OTLP/HTTP binary encoding:
// Content-Type application/x-protobuf, the response an
// ExportTraceServiceResponse of the same encoding; OTLP specification
// 1.x, "OTLP/HTTP").
package otlptest
