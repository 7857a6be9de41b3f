package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/signal"
	"syscall"
	"time"

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
	srv := &http.Server{Handler: sim, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	fmt.Fprintf(stdout, "simulated GPU serving %s at http://%s (max_batch %d)\n", cfg.Model, ln.Addr(), cfg.MaxBatch)
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(stderr, "sluice sim: %v\n", err)
		return 1
	}
	return 0
}
