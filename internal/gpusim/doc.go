// Package gpusim is a simulated GPU inference backend: an OpenAI-compatible
// model server (/v1/chat/completions, /v1/completions, /v1/embeddings,
// /v1/models, /health, /metrics) whose latency comes from a
// continuous-batching scheduler modelled on vLLM. At most MaxBatch sequences
// decode together; every decode step takes StepBase + StepPerSeq × batch size
// and emits one token to each running sequence; a newly admitted sequence
// first pays its prefill (PrefillBase + PrefillPerToken × prompt tokens),
// which lengthens that step for the whole batch; the rest wait in a FIFO
// queue. It exports vLLM's Prometheus metric names, optionally an ORCA
// endpoint-load-metrics header, and has fault knobs (fail before the first
// token, die mid-stream, stall, slow headers), settable for every request in
// Config or for one request through X-Sim-* request headers. It is the test
// and benchmark backend for Sluice and the engine behind "sluice sim".
package gpusim
