// Package gpusim is a simulated GPU inference backend: an OpenAI-compatible
// model server (/v1/chat/completions, /v1/completions, /v1/embeddings,
// /v1/models, /health, /metrics) whose latency comes from a
// continuous-batching scheduler modelled on vLLM. At most MaxBatch sequences
// decode together; every decode step takes StepBase + StepPerSeq × batch size
// and emits one token to each running sequence; a newly admitted sequence
// first pays its prefill (PrefillBase + PrefillPerToken × prompt tokens, about
// four characters a token), which lengthens that step for the whole batch;
// the rest wait in a FIFO queue. With Config.PrefixCacheBlocks, a prefix
// cache per Sim (vLLM's automatic prefix caching: chained hashes of
// 16-token blocks, LRU) lets a prompt's cached leading blocks skip their
// prefill; usage reports prompt_tokens_details.cached_tokens and /metrics
// vllm:prefix_cache_queries_total and vllm:prefix_cache_hits_total. A client that goes away frees its slot at
// once; a client that reads slowly does not slow the batch (its tokens are
// generated on schedule and sent in one write when it catches up, as vLLM
// coalesces a lagging request's output). Text is deterministic words derived
// from Seed and the prompt. It exports vLLM's Prometheus metric names
// (vllm:num_requests_running, vllm:num_requests_waiting,
// vllm:kv_cache_usage_perc, TTFT/ITL/E2E histograms, token counters, one
// registry per Sim), optionally an ORCA endpoint-load-metrics header, and has
// fault knobs (fail before the first token, die mid-stream, stall, slow
// headers) set for every request in Config or for one request with the
// X-Sim-Fail, X-Sim-Die-After, X-Sim-Stall-After, X-Sim-Stall-For and
// X-Sim-Slow-Start request headers. It is the test and benchmark backend for
// Sluice and the engine behind "sluice sim".
//
// In the batch model, token timing depends on load: every running sequence
// gets its token at the same step boundary (so thousands of streams write
// in one burst), a step lengthens with the batch and with every prefill
// admitted into it, and a request beyond MaxBatch waits. For benchmarks of
// what a proxy adds per token, Config.Pace replaces the scheduler with a
// timer per request (token i at arrival + prefill + i × Pace, on an
// absolute schedule), so gaps are Pace at any concurrency and streams
// started at different times stay out of phase; Config.StampTokens puts
// the wall-clock write time into every streamed chunk ("sluice_emit_ns",
// Unix nanoseconds) for sluice bench's token delay.
package gpusim
