package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

const usage = `sluice: an edge proxy for streaming LLM inference

Usage:
  sluice                      serve $SLUICE_CONFIG, or the embedded default without it
  sluice serve -c FILE        serve a configuration file
  sluice check -c FILE        validate a configuration file (-diff OLD: what the change does)
  sluice hash-key KEY         print the hash of an API key for the config ("-" reads stdin)
  sluice sim [flags]          run one simulated OpenAI-compatible GPU backend
  sluice bench -target URL    load generator: TTFT/ITL percentiles, sweeps, comparisons
  sluice diagnose [-admin URL]  name a node's bottleneck stage from its /debug/stats
  sluice config default       print the embedded default configuration
  sluice version              print the version and build info (VCS revision, Go version)

Flags are written Go's way, with one dash: -c FILE, -diff OLD (two dashes
are accepted too). -c defaults to $SLUICE_CONFIG in serve and check.
Run "sluice COMMAND -help" for a command's flags.
`

func main() {
	// Sluice checks the UDP buffers itself and prints its own hint (see
	// listen.Server.UDPBufferHint); quic-go's log line would repeat it.
	if os.Getenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING") == "" {
		os.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	}
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run dispatches a command line and returns the exit code.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return cmdServe(nil, stdout, stderr)
	}
	switch args[0] {
	case "serve":
		return cmdServe(args[1:], stdout, stderr)
	case "check":
		return cmdCheck(args[1:], stdout, stderr)
	case "hash-key":
		return cmdHashKey(args[1:], stdin, stdout, stderr)
	case "sim":
		return cmdSim(args[1:], stdout, stderr)
	case "bench":
		return cmdBench(args[1:], stdout, stderr)
	case "diagnose":
		return cmdDiagnose(args[1:], stdout, stderr)
	case "config":
		return cmdConfig(args[1:], stdout, stderr)
	case "version":
		return cmdVersion(args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "sluice: unknown command %q\n\n%s", args[0], usage)
	return 2
}

// configEnv names the environment variable that is the default for -c
// (serve, check).
const configEnv = "SLUICE_CONFIG"

// configFlag defines -c on fs with $SLUICE_CONFIG as its default.
func configFlag(fs *flag.FlagSet, usage string) *string {
	return fs.String("c", os.Getenv(configEnv), usage)
}

// flagExit is the exit code for a flag parsing error: 0 for -help.
func flagExit(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 2
}
