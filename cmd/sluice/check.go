package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/configs"
)

func cmdCheck(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := configFlag(fs, "config `file` to validate (required; default $SLUICE_CONFIG)")
	against := fs.String("diff", "", "compare with the config in `OLD`: a file, or a running node's admin URL (http://127.0.0.1:9090)")
	tokenFile := fs.String("admin-token-file", "", "with -diff URL: read the running node's admin token from `FILE`")
	fs.Usage = func() {
		fmt.Fprintf(stderr, `Usage: sluice check -c FILE [-diff OLD]

Validates a config file (-c, else $SLUICE_CONFIG) and what it names: its
tenants_file, admin.token_file and the files and environment variables
its secrets come from. Prints every problem as
file:line:col: message and exits 1, or prints ok and exits 0.

With -diff, also prints what changing from OLD to FILE does: routes, pools
and backends added, removed or changed, tenants added and removed, key
rotations, limits raised or lowered, and the keys a running node cannot
change without a restart. OLD is a file, or the admin URL of a running node
(its active config is read from /debug/config?format=yaml; pass the node's
admin token with -admin-token-file when it has one).

Prints a WARNING when the admin listener binds a non-loopback address
without admin.token_file.

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return flagExit(err)
	}
	if *file == "" || fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	cfg, err := configs.Load(*file)
	if err != nil {
		for _, e := range configs.Errors(err) {
			fmt.Fprintln(stderr, e)
		}
		return 1
	}
	fmt.Fprintln(stdout, "ok")
	if cfg.AdminExposed() {
		fmt.Fprintf(stderr, "WARNING: listeners.admin %q is not a loopback address and admin.token_file is not set:\n"+
			"WARNING: anyone who can reach it can reload the config and read /debug. Set admin.token_file\n"+
			"WARNING: or bind the admin listener to 127.0.0.1.\n", cfg.Listeners.Admin)
	}
	if *against == "" {
		return 0
	}
	token, err := readTokenFile(*tokenFile)
	if err != nil {
		fmt.Fprintf(stderr, "sluice check: %v\n", err)
		return 2
	}
	old, err := loadOld(*against, token)
	if err != nil {
		fmt.Fprintf(stderr, "sluice check: reading %s: %v\n", *against, err)
		for _, e := range configs.Errors(err) {
			fmt.Fprintf(stderr, "  %v\n", e)
		}
		return 2
	}
	configs.Compare(old, cfg).Write(stdout)
	return 0
}

// loadOld loads the config to compare with: a file, or a running node's
// active config (and tenants file) from its admin listener.
func loadOld(src, token string) (*configs.Config, error) {
	if !strings.HasPrefix(src, "http://") && !strings.HasPrefix(src, "https://") {
		return configs.Load(src)
	}
	base := strings.TrimSuffix(src, "/") + "/debug/config?format="
	data, err := fetch(base+"yaml", token)
	if err != nil {
		return nil, err
	}
	return configs.ParseWith(src, data, func(string) ([]byte, error) { return fetch(base+"tenants", token) })
}

// readTokenFile reads an admin token (white space trimmed); "" for no
// file.
func readTokenFile(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(data)), nil
}

// fetch GETs url, with the admin token when there is one.
func fetch(url, token string) ([]byte, error) {
	c := &http.Client{Timeout: 30 * time.Second}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return io.ReadAll(resp.Body)
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
