package node

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/sluice-proxy/sluice/configs"
	"github.com/sluice-proxy/sluice/internal/otlptest"
	"github.com/sluice-proxy/sluice/proxy/listen"
)

// startTracedNode starts a node from cfg with the tracing section added,
// sends one streamed request with the client's traceparent, and stops the
// node (Shutdown, Close) without flushing the spans first: what the
// receiver then holds is what the node's shutdown flushed (the batch
// processor's own timer is 5 s).
func startTracedNode(t *testing.T, tracing, traceID string) {
	t.Helper()
	c, err := configs.Parse("t.yaml", []byte(nodeConfig{}.String()+tracing))
	if err != nil {
		t.Fatal(err)
	}
	n, err := Start(context.Background(), c, Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Version: "v9.9.9"})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+n.server.Addr(listen.ListenerHTTP)+"/v1/chat/completions",
		strings.NewReader(`{"model":"sim-small","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer "+key1)
	req.Header.Set("Traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), "[DONE]") {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	n.Shutdown()
	n.Close()
}

func serverSpan(t *testing.T, rcv *otlptest.Receiver, traceID string) otlptest.Span {
	t.Helper()
	for _, s := range rcv.Trace(traceID) {
		if s.Kind == tracepb.Span_SPAN_KIND_SERVER {
			return s
		}
	}
	t.Fatalf("no server span of trace %s among %d spans received (bad exports: %v)", traceID, len(rcv.Spans()), rcv.Bad())
	return otlptest.Span{}
}

// A node configured with a tracing section exports over OTLP/HTTP, and
// its Close flushes the spans still queued.
func TestTracingNodeFlushesAtClose(t *testing.T) {
	rcv := otlptest.Start(t)
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	startTracedNode(t, "tracing: {enabled: true, endpoint: \""+rcv.URL+"\", sampler_ratio: 1}\n", traceID)
	s := serverSpan(t, rcv, traceID)
	if s.Resource["service.name"] != "sluice" || s.Resource["service.version"] != "v9.9.9" || s.Attrs["sluice.tenant.id"] != "t1" {
		t.Fatalf("server span resource %v attrs %v", s.Resource, s.Attrs)
	}
	if len(rcv.Trace(traceID)) < 2 {
		t.Fatalf("%d spans; want the server span and the attempt's", len(rcv.Trace(traceID)))
	}
}

// The standard OTEL_* variables configure what the section leaves out:
// here the gRPC protocol, the endpoint, the service name and the sampler.
func TestTracingFromOTELEnvOverGRPC(t *testing.T) {
	rcv := otlptest.StartGRPC(t)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+rcv.GRPCAddr)
	t.Setenv("OTEL_SERVICE_NAME", "edge-eu-1")
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
	t.Setenv("OTEL_TRACES_SAMPLER_ARG", "0")
	const traceID = "0af7651916cd43dd8448eb211c80319c"
	startTracedNode(t, "tracing: {enabled: true}\n", traceID)
	// Ratio 0, but the client's traceparent is sampled: parent-based.
	s := serverSpan(t, rcv, traceID)
	if s.Resource["service.name"] != "edge-eu-1" {
		t.Fatalf("service.name %v; want OTEL_SERVICE_NAME's", s.Resource["service.name"])
	}
}

// OTEL_SDK_DISABLED turns tracing off whatever the section says.
func TestTracingSDKDisabled(t *testing.T) {
	rcv := otlptest.Start(t)
	t.Setenv("OTEL_SDK_DISABLED", "true")
	startTracedNode(t, "tracing: {enabled: true, endpoint: \""+rcv.URL+"\"}\n", "11111111111111111111111111111111")
	if n := rcv.Requests(); n != 0 {
		t.Fatalf("%d exports with OTEL_SDK_DISABLED=true; want none", n)
	}
}
