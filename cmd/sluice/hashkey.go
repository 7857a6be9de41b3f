package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/sluice-proxy/sluice/proxy"
)

func cmdHashKey(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hash-key", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: sluice hash-key KEY\n       sluice hash-key - < keyfile\n\nPrints the hash of an API key, the form tenants' keys take in the config.\nUse - to read the key from standard input (keeps it out of shell history).\n")
	}
	if err := fs.Parse(args); err != nil {
		return flagExit(err)
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	key := fs.Arg(0)
	if key == "-" {
		line, err := bufio.NewReader(stdin).ReadString('\n')
		if err != nil && err != io.EOF {
			fmt.Fprintf(stderr, "sluice hash-key: reading stdin: %v\n", err)
			return 1
		}
		key = strings.TrimRight(line, "\r\n")
	}
	if key == "" {
		fmt.Fprintln(stderr, "sluice hash-key: the key is empty")
		return 1
	}
	fmt.Fprintln(stdout, proxy.HashKey(key))
	return 0
}
