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
		fmt.Fprintf(stderr, "Usage: sluice sim [--addr HOST:PORT] [flags]\n\nRuns one simulated OpenAI-compatible GPU backend (continuous batching,\nvLLM metric names) for tests, demos and benchmarks.\n\n")
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
	fmt.Fprintf(stdout, "simulated GPU serving %s at http://%s (HTTP/1.1 and h2c, max_batch %d)\n", cfg.Model, ln.Addr(), cfg.MaxBatch)
	if err := sim.Serve(ctx, ln); err != nil {
		fmt.Fprintf(stderr, "sluice sim: %v\n", err)
		return 1
	}
	return 0
}
