package configs

import (
	"bytes"
	"strings"
	"testing"
)

// The tracing section decodes with every key, is off by default, and its
// headers' values (a collector's credentials) are secrets.
func TestTracingSection(t *testing.T) {
	c, err := Parse("min.yaml", []byte(valid))
	if err != nil {
		t.Fatal(err)
	}
	if c.Tracing.Enabled {
		t.Fatal("tracing is on by default")
	}
	y := valid + `tracing:
  enabled: true
  endpoint: "https://collector.example:4318"
  protocol: grpc
  sampler_ratio: 0.25
  headers: {x-api-key: "secret-123"}
  insecure: true
  service_name: edge-eu
`
	c, err = Parse("t.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	tr := c.Tracing
	if !tr.Enabled || tr.Endpoint != "https://collector.example:4318" || tr.Protocol != "grpc" || tr.SamplerRatio == nil ||
		*tr.SamplerRatio != 0.25 || tr.Headers["x-api-key"] != "secret-123" || !tr.Insecure || tr.ServiceName != "edge-eu" {
		t.Fatalf("tracing %+v", tr)
	}
	out := c.RedactedText()
	if bytes.Contains(out, []byte("secret-123")) {
		t.Fatalf("the collector's header value is shown:\n%s", out)
	}
	r, err := Parse("t.yaml", out)
	if err != nil || r.Tracing.Headers["x-api-key"] != Redacted {
		t.Fatalf("redacted: %v %+v", err, r.Tracing.Headers)
	}
	if d := Compare(r, c); !d.Empty() {
		t.Fatalf("redaction shows as a change: %v", d.Lines())
	}
}

// Bad tracing values are config errors at the section, enabled or not.
func TestTracingErrors(t *testing.T) {
	y := valid + "tracing:\n  protocol: http/json\n  sampler_ratio: 1.5\n  endpoint: collector:4318\n"
	_, err := Parse("t.yaml", []byte(y))
	var msgs []string
	for _, e := range Errors(err) {
		msgs = append(msgs, e.Error())
	}
	got := strings.Join(msgs, "\n")
	for _, want := range []string{`protocol "http/json"`, "sampler_ratio 1.5", `endpoint "collector:4318"`} {
		if !strings.Contains(got, want) {
			t.Errorf("errors:\n%s\nwant one about %s", got, want)
		}
	}
	for _, e := range Errors(err) {
		if e.Line == 0 {
			t.Errorf("%v has no position", e)
		}
	}
}

// A reload cannot change tracing: the exporter is made at start.
func TestTracingRestartRequired(t *testing.T) {
	old, err := Parse("a.yaml", []byte(valid))
	if err != nil {
		t.Fatal(err)
	}
	new, err := Parse("b.yaml", []byte(valid+"tracing: {enabled: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := Compare(old, new).RestartRequired; len(got) != 1 || got[0] != "tracing.enabled" {
		t.Fatalf("restart required %v; want tracing.enabled", got)
	}
}
