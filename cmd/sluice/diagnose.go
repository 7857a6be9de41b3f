package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/internal/diagnose"
	"github.com/sluice-proxy/sluice/proxy/observe"
)

func cmdDiagnose(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("diagnose", flag.ContinueOnError)
	fs.SetOutput(stderr)
	admin := fs.String("admin", "http://127.0.0.1:9090", "the node's admin `URL`")
	tokenFile := fs.String("admin-token-file", "", "read the node's admin token (admin.token_file) from `FILE`")
	var th diagnose.Thresholds
	fs.Float64Var(&th.TTFTP95, "ttft-p95", 0, "high TTFT P95 in `ms` when the node has no SLO (default 1000)")
	fs.Float64Var(&th.ITLP99, "itl-p99", 0, "high ITL P99 in `ms` when the node has no SLO (default 100)")
	fs.IntVar(&th.MinRequests, "min-requests", 0, "requests a window needs to be judged (default 20)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, `Usage: sluice diagnose [-admin URL] [flags]

Reads a node's /debug/stats, prints each route's stage breakdown
(P50/P95/P99) and names the bottleneck in plain words. Exits 1 when a
configured SLO (proxy.slo) is breached, 2 when the stats cannot be read.

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return flagExit(err)
	}
	token, err := readTokenFile(*tokenFile)
	var snap observe.StatsSnapshot
	if err == nil {
		snap, err = fetchStats(strings.TrimSuffix(*admin, "/")+"/debug/stats", token)
	}
	if err != nil {
		fmt.Fprintf(stderr, "sluice diagnose: %v\n", err)
		return 2
	}
	fmt.Fprintf(stdout, "node %s (region %s), up %.0f s, %d in flight\n\n", snap.Node, snap.Region, snap.UptimeS, snap.InFlight)
	reps := diagnose.Analyze(snap, th)
	if len(reps) == 0 {
		fmt.Fprintln(stdout, "no requests yet: nothing to diagnose")
		return 0
	}
	diagnose.Write(stdout, reps)
	diagnose.WritePredictions(stdout, snap.Backends)
	for _, r := range reps {
		if len(r.Breaches) > 0 {
			return 1
		}
	}
	return 0
}

func fetchStats(url, token string) (observe.StatsSnapshot, error) {
	var snap observe.StatsSnapshot
	c := &http.Client{Timeout: 5 * time.Second}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return snap, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return snap, fmt.Errorf("reading %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return snap, fmt.Errorf("reading %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&snap); err != nil {
		return snap, fmt.Errorf("decoding %s: %w", url, err)
	}
	return snap, nil
}
