// Package loadgen is the engine of `sluice bench`: a load generator for
// OpenAI-compatible streaming endpoints that measures what users feel (time
// to first token, inter-token latency, end-to-end latency) over HTTP/1.1,
// HTTP/2 (TLS or h2c), HTTP/3 and the Sluice WebSocket bridge, with
// closed-loop (fixed concurrency) or open-loop (Poisson) arrivals, seeded
// workloads named after real traffic, exact percentiles over every sample,
// the stage split read from Server-Timing, truncated-stream detection,
// concurrency or rate sweeps drawn as a latency-throughput curve (CSV and a
// self-contained SVG with the knee marked), and interleaved comparisons of
// two targets reported as ratios and added delays.
//
// Definitions used throughout:
//
//   - TTFT: from just before the request is written to the arrival of the
//     first event that carries content (a non-empty delta.content,
//     reasoning_content, tool_calls, or completions text). A role-only
//     first chunk or a usage chunk is not a token. For non-streamed
//     requests TTFT equals E2E (nothing is visible before the body).
//   - ITL: the gap between the arrival of consecutive content events of one
//     stream. Samples of every stream are pooled.
//   - E2E: from send to the [DONE] event (or the WebSocket done frame, or
//     the end of a non-streamed body).
//   - Token delay: for a content event whose chunk carries a top-level
//     "sluice_emit_ns" (EmitField: the Unix time in nanoseconds at which
//     the backend wrote it, as the Sluice simulator does with
//     stamp_tokens / sluice sim -stamp-tokens), the generator's wall
//     clock when the event was parsed minus that time: how long the token
//     took from the backend's write to the client, one sample per content
//     event (N is the tokens received). Both clocks are the host's wall
//     clock, so it is exact only with the backend on the same host. Unlike
//     ITL it separates what a proxy adds to every token from the backend's
//     own jitter: in a comparison, the token-delay delta of target (through
//     the proxy) over baseline (the backend directly) is the per-token
//     delay the proxy adds. A stamp that is not a non-negative integer is
//     ignored; chunks without one give no sample, and the report shows no
//     token delay row.
//   - Output tokens: usage.completion_tokens when the server reports it,
//     else the number of content-bearing choices received.
//   - Truncated: a 2xx stream that ended (EOF or connection error) without
//     [DONE] and without an explicit error event. Counted on its own, apart
//     from errors, because it is the failure a client cannot tell from a
//     finished answer.
//   - Percentiles are exact, nearest-rank over all kept samples: the p-th
//     percentile of n sorted samples is sample number ceil(p/100 × n), so
//     every reported figure is an observed value. Averages are never
//     headline figures.
//
// Closed loops of thousands of streams: Config.Ramp (-ramp) starts the
// workers evenly over a duration and never measures the ramp, so the
// figures are of the steady state rather than of a connection storm. Each
// HTTP/1.1 stream holds a connection, so the process needs a file
// descriptor per stream (per target in a comparison); sluice bench warns
// when the open-file limit is lower, and a dial that fails with "too many
// open files" says to raise it with ulimit -n.
//
// Run measures one configuration, Sweep measures a series of them, and
// Execute does what the `sluice bench` command does (run, print, write
// outputs). Config.RegisterFlags binds every option to a flag.FlagSet.
package loadgen
