package gpusim

import (
	"errors"
	"flag"
	"fmt"
	"time"
)

// Config describes one simulated GPU backend. Zero fields take the defaults
// documented on each field (see Config.WithDefaults). For the duration knobs
// whose zero value means "default", a negative value means "none" (0); it
// stays negative through WithDefaults, so applying the defaults twice (as a
// caller that defaults a Config before passing it to New does) changes
// nothing.
type Config struct {
	// Model is the model name served. Default "sim-small".
	Model string `yaml:"model"`
	// MaxBatch is how many sequences decode together. Default 8.
	MaxBatch int `yaml:"max_batch"`
	// StepBase + StepPerSeq × batch size is one decode step.
	// Defaults 20ms and 2ms; negative means none.
	StepBase   time.Duration `yaml:"step_base"`
	StepPerSeq time.Duration `yaml:"step_per_seq"`
	// PrefillPerToken × prompt tokens is the prefill cost. Default 1ms;
	// negative means none.
	PrefillPerToken time.Duration `yaml:"prefill_per_token"`
	// PrefillBase is a fixed prefill cost per request. Default 100ms;
	// negative means none.
	PrefillBase time.Duration `yaml:"prefill_base"`
	// DefaultMaxTokens is the output length when a request names no
	// max_tokens. Default 64. Such a request ends with finish_reason
	// "stop" (the simulated end-of-sequence), one that reaches its own
	// max_tokens with "length".
	DefaultMaxTokens int `yaml:"default_max_tokens"`
	// ReasoningTokens is how many of a chat stream's first tokens come as
	// reasoning deltas ("reasoning_content", as vLLM's reasoning parsers
	// send them; "reasoning_delta" on /v1/responses, "thinking_delta" on
	// /v1/messages) instead of content. Default 0.
	ReasoningTokens int `yaml:"reasoning_tokens"`
	// Seed makes the generated text deterministic. Default 1.
	Seed int64 `yaml:"seed"`
	// FailBeforeFirst is the probability that a request fails with a 500
	// before its first token. Default 0. The draws are a deterministic
	// sequence from Seed, in request arrival order.
	FailBeforeFirst float64 `yaml:"fail_before_first"`
	// DieAfterTokens, when > 0, aborts every stream after that many tokens
	// by closing the connection without [DONE].
	DieAfterTokens int `yaml:"die_after_tokens"`
	// StallAfterTokens, when > 0, makes every stream stop sending (without
	// closing) after that many tokens, for StallFor (0 = forever).
	StallAfterTokens int           `yaml:"stall_after_tokens"`
	StallFor         time.Duration `yaml:"stall_for"`
	// SlowStart delays the response headers of every request. Zero means
	// no delay.
	SlowStart time.Duration `yaml:"slow_start"`

	// KVCacheTokens is the simulated KV-cache capacity in tokens. A
	// sequence is admitted only when its prompt plus its max tokens fit
	// beside the reservations of the running sequences (no preemption);
	// a request that could never fit is refused with 400.
	// vllm:kv_cache_usage_perc is the tokens held by running sequences
	// (prompt + generated so far) over this capacity. Default 16384.
	KVCacheTokens int `yaml:"kv_cache_tokens"`
	// PrefixCacheBlocks is the simulated prefix cache's capacity in
	// blocks of PrefixBlockTokens tokens (vLLM's automatic prefix
	// caching: a prompt's leading blocks already cached skip their
	// prefill). Zero (default) means no prefix cache.
	PrefixCacheBlocks int `yaml:"prefix_cache_blocks"`
	// PrefixBlockTokens is the prefix cache's block size in tokens.
	// Default 16 (vLLM's default --block-size).
	PrefixBlockTokens int `yaml:"prefix_block_tokens"`
	// EmbeddingDim is the length of /v1/embeddings vectors. Default 64.
	EmbeddingDim int `yaml:"embedding_dim"`
	// LoadHeader, when true, answers ORCA load-report requests as vLLM
	// v0.11 does: a request carrying "endpoint-load-metrics-format: TEXT"
	// (or JSON) gets an endpoint-load-metrics header with
	// num_requests_waiting and kv_cache_usage_perc on its non-streamed
	// successful chat or completions response; nothing else gets one.
	// Ignored with SGLang or TGI metric names. Default off.
	LoadHeader bool `yaml:"load_header"`
	// MetricNames picks the engine whose load gauge names /metrics uses:
	// "vllm" (default: vLLM v0.11, vllm:kv_cache_usage_perc),
	// "vllm-v0" (vLLM v0.6, vllm:gpu_cache_usage_perc), "sglang"
	// (sglang:num_running_reqs, sglang:num_queue_reqs, sglang:token_usage)
	// or "tgi" (tgi_batch_current_size, tgi_queue_size). The histograms
	// and counters keep vLLM's names.
	MetricNames string `yaml:"metric_names"`

	// Pace, when > 0, replaces the batch scheduler with a timer per
	// request: token i (from 0) of a request is produced at its arrival +
	// its prefill (PrefillBase + PrefillPerToken × prompt tokens) + i ×
	// Pace, on an absolute schedule that does not drift, whatever the
	// load. Streams then never share a decode step, so inter-token gaps are
	// Pace and the simulator's own scheduling is not what a benchmark
	// measures. MaxBatch, StepBase, StepPerSeq and KV-cache admission are
	// not used (a request that could never fit is still refused);
	// vllm:num_requests_running counts the requests in progress and
	// num_requests_waiting and kv_cache_usage_perc stay 0. Default 0 (the
	// batch scheduler).
	Pace time.Duration `yaml:"pace"`
	// StampTokens, when true, adds "sluice_emit_ns": <Unix time in
	// nanoseconds> at the top level of every streamed chunk (role, token,
	// finish and usage chunks), read from the wall clock just before the
	// write that sends the chunk, so a client on the same host can measure
	// how long each token took to reach it (sluice bench reports it as
	// token delay). Default off; off costs nothing.
	StampTokens bool `yaml:"stamp_tokens"`
}

// Defaults of the zero Config fields.
const (
	DefaultModel           = "sim-small"
	DefaultMaxBatch        = 8
	DefaultStepBase        = 20 * time.Millisecond
	DefaultStepPerSeq      = 2 * time.Millisecond
	DefaultPrefillPerToken = time.Millisecond
	DefaultPrefillBase     = 100 * time.Millisecond
	DefaultOutputTokens    = 64
	DefaultSeed            = 1
	DefaultKVCacheTokens   = 16384
	DefaultEmbeddingDim    = 64
	// DefaultPrefixBlockTokens is vLLM's default --block-size.
	DefaultPrefixBlockTokens = 16
)

// WithDefaults returns c with every zero field set to its default. A
// negative "none" duration is kept as it is (the engine counts it as 0),
// so WithDefaults is idempotent.
func (c Config) WithDefaults() Config {
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	c.StepBase = durationDefault(c.StepBase, DefaultStepBase)
	c.StepPerSeq = durationDefault(c.StepPerSeq, DefaultStepPerSeq)
	c.PrefillPerToken = durationDefault(c.PrefillPerToken, DefaultPrefillPerToken)
	c.PrefillBase = durationDefault(c.PrefillBase, DefaultPrefillBase)
	if c.DefaultMaxTokens == 0 {
		c.DefaultMaxTokens = DefaultOutputTokens
	}
	if c.Seed == 0 {
		c.Seed = DefaultSeed
	}
	if c.KVCacheTokens == 0 {
		c.KVCacheTokens = DefaultKVCacheTokens
	}
	if c.EmbeddingDim == 0 {
		c.EmbeddingDim = DefaultEmbeddingDim
	}
	if c.PrefixBlockTokens == 0 {
		c.PrefixBlockTokens = DefaultPrefixBlockTokens
	}
	if c.MetricNames == "" {
		c.MetricNames = MetricsVLLM
	}
	return c
}

// durationDefault maps 0 to def; a negative value ("none") stays.
func durationDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// prefill is the prefill cost of a prompt of n tokens ("none" parts count
// as 0).
func (c *Config) prefill(n int) time.Duration {
	return max(c.PrefillBase, 0) + time.Duration(n)*max(c.PrefillPerToken, 0)
}

// step is the length of a decode step of n sequences ("none" parts count
// as 0).
func (c *Config) step(n int) time.Duration {
	return max(c.StepBase, 0) + time.Duration(n)*max(c.StepPerSeq, 0)
}

// Validate reports every invalid field, joined. It accepts a Config before
// or after WithDefaults.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.MaxBatch < 0 {
		bad("max_batch: %d is negative", c.MaxBatch)
	}
	if c.DefaultMaxTokens < 0 {
		bad("default_max_tokens: %d is negative", c.DefaultMaxTokens)
	}
	if !(c.FailBeforeFirst >= 0 && c.FailBeforeFirst <= 1) {
		bad("fail_before_first: %v is not a probability in [0, 1]", c.FailBeforeFirst)
	}
	if c.DieAfterTokens < 0 {
		bad("die_after_tokens: %d is negative", c.DieAfterTokens)
	}
	if c.StallAfterTokens < 0 {
		bad("stall_after_tokens: %d is negative", c.StallAfterTokens)
	}
	if c.StallFor < 0 {
		bad("stall_for: %v is negative", c.StallFor)
	}
	if c.SlowStart < 0 {
		bad("slow_start: %v is negative", c.SlowStart)
	}
	if c.KVCacheTokens < 0 {
		bad("kv_cache_tokens: %d is negative", c.KVCacheTokens)
	}
	if c.EmbeddingDim < 0 {
		bad("embedding_dim: %d is negative", c.EmbeddingDim)
	}
	if c.PrefixCacheBlocks < 0 {
		bad("prefix_cache_blocks: %d is negative", c.PrefixCacheBlocks)
	}
	if c.PrefixBlockTokens < 0 {
		bad("prefix_block_tokens: %d is negative", c.PrefixBlockTokens)
	}
	if c.Pace < 0 {
		bad("pace: %v is negative", c.Pace)
	}
	switch c.MetricNames {
	case "", MetricsVLLM, MetricsVLLMV0, MetricsSGLang, MetricsTGI:
	default:
		bad("metric_names: %q must be vllm, vllm-v0, sglang or tgi", c.MetricNames)
	}
	d := c.WithDefaults()
	if d.KVCacheTokens > 0 && d.DefaultMaxTokens >= d.KVCacheTokens {
		bad("default_max_tokens: %d does not fit in kv_cache_tokens %d", d.DefaultMaxTokens, d.KVCacheTokens)
	}
	return errors.Join(errs...)
}

// sanitized returns c with defaults applied and invalid values clamped to
// the nearest valid one, so New never fails or panics on bad input.
func (c Config) sanitized() Config {
	c = c.WithDefaults()
	c.MaxBatch = max(c.MaxBatch, 1)
	c.DefaultMaxTokens = max(c.DefaultMaxTokens, 1)
	c.FailBeforeFirst = min(max(c.FailBeforeFirst, 0), 1)
	if c.FailBeforeFirst != c.FailBeforeFirst { // NaN
		c.FailBeforeFirst = 0
	}
	c.DieAfterTokens = max(c.DieAfterTokens, 0)
	c.StallAfterTokens = max(c.StallAfterTokens, 0)
	c.StallFor = max(c.StallFor, 0)
	c.SlowStart = max(c.SlowStart, 0)
	c.KVCacheTokens = max(c.KVCacheTokens, c.DefaultMaxTokens+1)
	c.EmbeddingDim = max(c.EmbeddingDim, 1)
	c.Pace = max(c.Pace, 0)
	c.PrefixCacheBlocks = max(c.PrefixCacheBlocks, 0)
	c.PrefixBlockTokens = max(c.PrefixBlockTokens, 1)
	switch c.MetricNames {
	case MetricsVLLM, MetricsVLLMV0, MetricsSGLang, MetricsTGI:
	default:
		c.MetricNames = MetricsVLLM
	}
	return c
}

// Engines whose load gauge names a Sim's /metrics uses (Config.MetricNames).
const (
	MetricsVLLM   = "vllm"
	MetricsVLLMV0 = "vllm-v0"
	MetricsSGLang = "sglang"
	MetricsTGI    = "tgi"
)

// RegisterFlags defines one flag per field on fs, writing into c. It first
// sets c to c.WithDefaults(), so the flag defaults printed by -help are the
// real ones. Durations are Go durations ("20ms"); for the step and prefill
// durations 0 means the default and a negative value means none.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	*c = c.WithDefaults()
	fs.StringVar(&c.Model, "model", c.Model, "model name served")
	fs.IntVar(&c.MaxBatch, "max-batch", c.MaxBatch, "sequences that decode together")
	fs.DurationVar(&c.StepBase, "step-base", c.StepBase, "fixed part of one decode step (negative: none)")
	fs.DurationVar(&c.StepPerSeq, "step-per-seq", c.StepPerSeq, "decode step cost per sequence in the batch (negative: none)")
	fs.DurationVar(&c.PrefillBase, "prefill-base", c.PrefillBase, "fixed prefill cost per request (negative: none)")
	fs.DurationVar(&c.PrefillPerToken, "prefill-per-token", c.PrefillPerToken, "prefill cost per prompt token (negative: none)")
	fs.IntVar(&c.DefaultMaxTokens, "default-max-tokens", c.DefaultMaxTokens, "output tokens when a request names no max_tokens")
	fs.Int64Var(&c.Seed, "seed", c.Seed, "seed of the generated text and of fault draws")
	fs.Float64Var(&c.FailBeforeFirst, "fail-before-first", c.FailBeforeFirst, "probability of a 500 before the first token")
	fs.IntVar(&c.DieAfterTokens, "die-after-tokens", c.DieAfterTokens, "abort every stream after this many tokens (0: never)")
	fs.IntVar(&c.StallAfterTokens, "stall-after-tokens", c.StallAfterTokens, "stall every stream after this many tokens (0: never)")
	fs.DurationVar(&c.StallFor, "stall-for", c.StallFor, "how long a stall lasts (0: forever)")
	fs.DurationVar(&c.SlowStart, "slow-start", c.SlowStart, "delay before the response headers")
	fs.IntVar(&c.KVCacheTokens, "kv-cache-tokens", c.KVCacheTokens, "simulated KV-cache capacity in tokens")
	fs.IntVar(&c.EmbeddingDim, "embedding-dim", c.EmbeddingDim, "length of embedding vectors")
	fs.IntVar(&c.PrefixCacheBlocks, "prefix-cache-blocks", c.PrefixCacheBlocks, "prefix cache capacity in blocks (0: no prefix cache)")
	fs.IntVar(&c.PrefixBlockTokens, "prefix-block-tokens", c.PrefixBlockTokens, "prefix cache block size in tokens")
	fs.BoolVar(&c.LoadHeader, "load-header", c.LoadHeader, "answer endpoint-load-metrics-format requests with vLLM's endpoint-load-metrics header")
	fs.StringVar(&c.MetricNames, "metric-names", c.MetricNames, "load gauge names in /metrics: vllm, vllm-v0, sglang or tgi")
	fs.DurationVar(&c.Pace, "pace", c.Pace, "emit each request's tokens on its own timer, one every `interval` after the prefill,\ninstead of batch decode steps (0: batch scheduler)")
	fs.BoolVar(&c.StampTokens, "stamp-tokens", c.StampTokens, `add "sluice_emit_ns" (Unix ns, taken just before the write) to every streamed chunk`)
}
