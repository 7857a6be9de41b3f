package tracing

import (
	"context"
	"strings"
	"testing"
)

func TestTraceIDOf(t *testing.T) {
	const id = "0af7651916cd43dd8448eb211c80319c"
	for _, c := range []struct{ in, want string }{
		{"00-" + id + "-b7ad6b7169203331-01", id},
		{"00-" + id + "-b7ad6b7169203331-00", id},
		{"01-" + id + "-b7ad6b7169203331-01-future", id}, // a later version may append fields
		{"00-" + id + "-b7ad6b7169203331-01-x", ""},      // version 00 may not
		{"ff-" + id + "-b7ad6b7169203331-01", ""},
		{"00-" + strings.ToUpper(id) + "-b7ad6b7169203331-01", ""},
		{"00-00000000000000000000000000000000-b7ad6b7169203331-01", ""},
		{"00-" + id + "-0000000000000000-01", ""},
		{"00-" + id + "-b7ad6b7169203331", ""},
		{"", ""},
		{"garbage", ""},
	} {
		if got := TraceIDOf(c.in); got != c.want {
			t.Errorf("TraceIDOf(%q) = %q; want %q", c.in, got, c.want)
		}
	}
}

func TestNewOffAndInvalid(t *testing.T) {
	if tr, err := New(context.Background(), Config{}, ""); tr != nil || err != nil {
		t.Fatalf("disabled: %v %v; want nil, nil", tr, err)
	}
	bad := 2.0
	if _, err := New(context.Background(), Config{Enabled: true, SamplerRatio: &bad}, ""); err == nil {
		t.Fatal("sampler_ratio 2 accepted")
	}
	if _, err := New(context.Background(), Config{Enabled: true, Protocol: "http/json"}, ""); err == nil {
		t.Fatal("protocol http/json accepted")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
	if _, err := New(context.Background(), Config{Enabled: true}, ""); err == nil || !strings.Contains(err.Error(), "http/json") {
		t.Fatalf("OTEL_EXPORTER_OTLP_PROTOCOL=http/json: %v; want an error naming it", err)
	}
}
