package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os/signal"
	"syscall"

	"github.com/sluice-proxy/sluice/internal/gpusim"
)

func cmdSim(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8000", "listen `address`")
	var cfg gpusim.Config
	cfg.RegisterFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, `Usage: sluice sim [-addr HOST:PORT] [flags]

Runs one simulated OpenAI-compatible GPU backend (continuous batching,
vLLM metric names) for tests, demos and benchmarks.

Durations take a unit (20ms, 1s); for the step and prefill durations a
negative value (-1ns) means none.

For measuring what a proxy adds per token, pace every stream on its own
timer and stamp the chunks, then compare through the proxy and directly:
  sluice sim -pace 10ms -prefill-base -1ns -prefill-per-token -1ns -stamp-tokens
  sluice bench -target http://PROXY -compare http://127.0.0.1:8000 -output-tokens 200 -concurrency 2000 \
    -ramp 10s -duration 60s
-pace ignores max-batch and the step costs: token i of a request is sent
at its arrival + prefill + i x pace, whatever the load. -stamp-tokens adds
"sluice_emit_ns" (Unix nanoseconds, read just before the write) to every
streamed chunk; sluice bench reports arrival minus it as "token delay".

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return flagExit(err)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "sluice sim: %v\n", err)
		return 2
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintf(stderr, "sluice sim: %v\n", err)
		return 1
	}
	sim := gpusim.New(cfg)
	defer sim.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	mode := fmt.Sprintf("max_batch %d", cfg.MaxBatch)
	if cfg.Pace > 0 {
		mode = fmt.Sprintf("paced, one token every %v per stream", cfg.Pace)
	}
	if cfg.StampTokens {
		mode += ", chunks stamped with sluice_emit_ns"
	}
	fmt.Fprintf(stdout, "simulated GPU serving %s at http://%s (HTTP/1.1 and h2c, %s)\n", cfg.Model, ln.Addr(), mode)
	if err := sim.Serve(ctx, ln); err != nil {
		fmt.Fprintf(stderr, "sluice sim: %v\n", err)
		return 1
	}
	return 0
}
