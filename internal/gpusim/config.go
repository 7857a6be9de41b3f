package gpusim

import "time"

// Config describes one simulated GPU backend. Zero fields take the defaults
// documented on each field (see Config.WithDefaults).
type Config struct {
	// Model is the model name served. Default "sim-small".
	Model string `yaml:"model"`
	// MaxBatch is how many sequences decode together. Default 8.
	MaxBatch int `yaml:"max_batch"`
	// StepBase + StepPerSeq × batch size is one decode step.
	// Defaults 20ms and 2ms.
	StepBase   time.Duration `yaml:"step_base"`
	StepPerSeq time.Duration `yaml:"step_per_seq"`
	// PrefillPerToken × prompt tokens is the prefill cost. Default 1ms.
	PrefillPerToken time.Duration `yaml:"prefill_per_token"`
	// PrefillBase is a fixed prefill cost per request. Default 100ms.
	PrefillBase time.Duration `yaml:"prefill_base"`
	// DefaultMaxTokens is the output length when a request names no
	// max_tokens. Default 64.
	DefaultMaxTokens int `yaml:"default_max_tokens"`
	// Seed makes the generated text deterministic. Default 1.
	Seed int64 `yaml:"seed"`
	// FailBeforeFirst is the probability that a request fails with a 500
	// before its first token. Default 0.
	FailBeforeFirst float64 `yaml:"fail_before_first"`
	// DieAfterTokens, when > 0, aborts every stream after that many tokens
	// by closing the connection without [DONE].
	DieAfterTokens int `yaml:"die_after_tokens"`
	// StallAfterTokens, when > 0, makes every stream stop sending (without
	// closing) after that many tokens, for StallFor (0 = forever).
	StallAfterTokens int           `yaml:"stall_after_tokens"`
	StallFor         time.Duration `yaml:"stall_for"`
	// SlowStart delays the response headers of every request.
	SlowStart time.Duration `yaml:"slow_start"`
}
