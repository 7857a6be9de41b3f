package main

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/internal/node"
	"github.com/sluice-proxy/sluice/proxy/listen"
)

// printHTTP3 tells how to try HTTP/3 with curl, or why the local curl
// cannot, and passes on the hint about small UDP buffers.
func printHTTP3(w io.Writer, n *node.Node, key, model string) {
	a := n.Server().Addr(listen.ListenerHTTP3)
	if a == "" {
		return
	}
	if hint := n.Server().UDPBufferHint(); hint != "" {
		fmt.Fprintf(w, "Warning: %s\n\n", hint)
	}
	version, ok := curlHTTP3()
	switch {
	case ok:
		fmt.Fprintf(w, "Over HTTP/3:\n  curl --http3-only -k -N https://%s/v1/chat/completions \\\n    -H 'Authorization: Bearer %s' \\\n"+
			"    -d '{\"model\":\"%s\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'\n\n", a, key, model)
	case version != "":
		fmt.Fprintf(w, "HTTP/3: the local %s was built without HTTP/3 (no \"HTTP3\" in curl --version); "+
			"use a curl built with HTTP/3 (--http3-only -k https://%s/...) or a browser, which learns of HTTP/3 from Alt-Svc.\n\n", version, a)
	default:
		fmt.Fprintf(w, "HTTP/3: no curl found to suggest a command; any HTTP/3 client can reach https://%s/ over UDP.\n\n", a)
	}
}

// curlHTTP3 reports the local curl's version line ("" when there is no
// curl) and whether it supports HTTP/3. It is a variable for tests.
var curlHTTP3 = func() (version string, ok bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "curl", "--version").Output()
	if err != nil {
		return "", false
	}
	return parseCurlVersion(string(out))
}

// parseCurlVersion reads "curl --version" output: the program and version
// ("curl 8.5.0") and whether its Features line lists HTTP3.
func parseCurlVersion(out string) (version string, ok bool) {
	lines := strings.Split(out, "\n")
	if f := strings.Fields(lines[0]); len(f) >= 2 {
		version = f[0] + " " + f[1]
	}
	for _, l := range lines {
		if rest, found := strings.CutPrefix(l, "Features:"); found {
			for _, feat := range strings.Fields(rest) {
				if feat == "HTTP3" {
					ok = true
				}
			}
		}
	}
	return version, ok
}
