package gpusim

import (
	"flag"
	"math"
	"strings"
	"testing"
	"time"
)

func TestConfigDefaults(t *testing.T) {
	got := Config{StepPerSeq: -1}.WithDefaults()
	want := Config{
		Model: "sim-small", MaxBatch: 8, StepBase: 20 * time.Millisecond, StepPerSeq: -1,
		PrefillPerToken: time.Millisecond, PrefillBase: 100 * time.Millisecond,
		DefaultMaxTokens: 64, Seed: 1, KVCacheTokens: 16384, EmbeddingDim: 64, MetricNames: "vllm",
		PrefixBlockTokens: 16,
	}
	if got != want {
		t.Errorf("WithDefaults:\n got %+v\nwant %+v", got, want)
	}
	if twice := got.WithDefaults(); twice != got {
		t.Errorf("WithDefaults twice:\n got %+v\nwant %+v", twice, got)
	}
	if d := got.step(3); d != 20*time.Millisecond {
		t.Errorf("step of 3 with step_per_seq none = %v; want 20ms", d)
	}
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("zero Config: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	bad := Config{
		MaxBatch: -1, FailBeforeFirst: 1.5, DieAfterTokens: -2, StallAfterTokens: -1,
		StallFor: -time.Second, SlowStart: -time.Second, KVCacheTokens: 10, DefaultMaxTokens: 64,
	}
	err := bad.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, field := range []string{"max_batch", "fail_before_first", "die_after_tokens", "stall_after_tokens",
		"stall_for", "slow_start", "default_max_tokens"} {
		if !strings.Contains(err.Error(), field+":") {
			t.Errorf("error %q does not name %s", err, field)
		}
	}
	if err := (Config{FailBeforeFirst: math.NaN()}).Validate(); err == nil {
		t.Error("NaN probability accepted")
	}
	// New never panics on bad input: it clamps.
	s := New(bad)
	defer s.Close()
	if c := s.Config(); c.MaxBatch != 1 || c.FailBeforeFirst != 1 || c.KVCacheTokens <= c.DefaultMaxTokens {
		t.Errorf("sanitized config %+v", c)
	}
}

func TestRegisterFlags(t *testing.T) {
	var c Config
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	c.RegisterFlags(fs)
	if f := fs.Lookup("step-base"); f == nil || f.DefValue != "20ms" {
		t.Errorf("step-base flag %+v; want default 20ms", f)
	}
	args := []string{
		"--model=m", "--max-batch=3", "--step-base=5ms", "--step-per-seq=-1ns", "--prefill-base=7ms",
		"--prefill-per-token=0", "--default-max-tokens=9", "--seed=4", "--fail-before-first=0.25",
		"--die-after-tokens=6", "--stall-after-tokens=2", "--stall-for=1s", "--slow-start=3ms",
		"--kv-cache-tokens=999", "--embedding-dim=4", "--prefix-cache-blocks=50", "--prefix-block-tokens=8", "--load-header", "--metric-names=sglang", "--pace=10ms", "--stamp-tokens",
	}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	got := c.WithDefaults()
	want := Config{
		Model: "m", MaxBatch: 3, StepBase: 5 * time.Millisecond, StepPerSeq: -1,
		PrefillBase: 7 * time.Millisecond, PrefillPerToken: time.Millisecond, DefaultMaxTokens: 9, Seed: 4,
		FailBeforeFirst: 0.25, DieAfterTokens: 6, StallAfterTokens: 2, StallFor: time.Second,
		SlowStart: 3 * time.Millisecond, KVCacheTokens: 999, EmbeddingDim: 4, LoadHeader: true, MetricNames: "sglang",
		Pace: 10 * time.Millisecond, StampTokens: true, PrefixCacheBlocks: 50, PrefixBlockTokens: 8,
	}
	if got != want {
		t.Errorf("flags:\n got %+v\nwant %+v", got, want)
	}
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n != 21 {
		t.Errorf("%d flags; want one per Config field (21)", n)
	}
}
