package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"syscall"

	"github.com/sluice-proxy/sluice/internal/loadgen"
)

func cmdBench(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg loadgen.Config
	cfg.RegisterFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, `Usage: sluice bench -target URL [flags]

Load generator for OpenAI-compatible endpoints (Sluice or a backend directly):
TTFT, ITL and end-to-end latency at P50/P95/P99/max, throughput, status
counts and truncated streams, and the stage split from Server-Timing.

Token delay: when the backend stamps its chunks with "sluice_emit_ns" (its
wall-clock write time in Unix ns: sluice sim -stamp-tokens), every token's
arrival minus that time is reported as "token delay" (JSON token_delay,
same host only). With -compare (target through the proxy, baseline the
simulator directly) its delta is the delay the proxy adds to each token.

Thousands of streams: -ramp spreads the closed-loop workers' starts over a
duration that is never measured; each HTTP/1.1 stream needs a file
descriptor (raise ulimit -n; the bench warns when it is too low).

Examples:
  sluice bench -target http://127.0.0.1:8080 -api-key sk-sluice-demo -model sim-small -concurrency 16 -duration 20s
  sluice bench -target http://127.0.0.1:8080 -api-key sk-sluice-demo -sweep concurrency=1,2,4,8,16,32 -svg curve.svg
  sluice bench -target http://127.0.0.1:8080 -compare http://127.0.0.1:8000 -api-key sk-sluice-demo
  sluice bench -target http://127.0.0.1:8080 -compare http://127.0.0.1:8000 -api-key sk-sluice-demo \
    -output-tokens 200 -concurrency 2000 -ramp 10s -duration 60s   (sim: -pace 10ms -stamp-tokens)

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return flagExit(err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sluice bench: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := loadgen.Execute(ctx, cfg, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "sluice bench: %v\n", err)
		return 1
	}
	return 0
}
