package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/sluice-proxy/sluice/configs"
)

func cmdCheck(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("c", "", "config `file` to validate (required)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: sluice check -c FILE\n\nValidates a config file. Prints every problem as file:line:col: message\nand exits 1, or prints ok and exits 0.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return flagExit(err)
	}
	if *file == "" || fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	if _, err := configs.Load(*file); err != nil {
		for _, e := range configs.Errors(err) {
			fmt.Fprintln(stderr, e)
		}
		return 1
	}
	fmt.Fprintln(stdout, "ok")
	return 0
}

func cmdConfig(args []string, stdout, stderr io.Writer) int {
	if len(args) != 1 || args[0] != "default" {
		fmt.Fprintln(stderr, "Usage: sluice config default\n\nPrints the embedded default configuration, a starting point for your own.")
		if len(args) == 1 && (args[0] == "-h" || args[0] == "--help") {
			return 0
		}
		return 2
	}
	stdout.Write(configs.DefaultYAML())
	return 0
}
