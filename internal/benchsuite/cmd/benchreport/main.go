// Command benchreport writes OUTDIR/results.md from the raw output of
// docs/benchmarks/run.sh (OUTDIR/raw/*.json).
package main

import (
	"fmt"
	"os"

	"github.com/sluice-proxy/sluice/internal/benchsuite"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: benchreport OUTDIR")
		os.Exit(2)
	}
	if err := benchsuite.WriteFile(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}
