package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/configs"
	"github.com/sluice-proxy/sluice/internal/node"
	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/proxy/listen"
)

const (
	key1 = "sk-test-one"
	key2 = "sk-test-two"
)

// testSim is a fast simulator's settings, flow style.
func testSim(name, model string, seed int) string {
	return fmt.Sprintf(`  - {name: %s, model: %s, max_batch: 64, step_base: 5ms, step_per_seq: 0s, prefill_base: 1ms, prefill_per_token: 0s, seed: %d}
`, name, model, seed)
}

// baseConfig is a node on free loopback ports with two simulators, one
// pool and one route; extra is appended (more pools, routes, simulators
// go in their own sections through the %s markers).
type nodeConfig struct {
	Node       string // extra node keys, flow style: "drain_delay: 1s"
	Tenants    string // the tenants section's items
	TenantsRaw string // replaces the tenants section (e.g. tenants_file)
	Sims       string
	Pools      string
	Routes     string
}

func (c nodeConfig) String() string {
	var b strings.Builder
	if !strings.Contains(c.Node, "drain_timeout") {
		c.Node = strings.TrimPrefix(c.Node+", drain_timeout: 5s", ", ")
	}
	fmt.Fprintf(&b, "node: {name: test%s}\n", prefixComma(c.Node))
	b.WriteString("listeners:\n  http: 127.0.0.1:0\n  admin: 127.0.0.1:0\n")
	if c.TenantsRaw != "" {
		b.WriteString(c.TenantsRaw)
	} else {
		b.WriteString("tenants:\n")
		if c.Tenants == "" {
			c.Tenants = tenant("t1", "max_concurrency: 100", key1)
		}
		b.WriteString(c.Tenants)
	}
	if c.Sims == "" {
		c.Sims = testSim("gpu-a", "sim-small", 1) + testSim("gpu-b", "sim-small", 2)
	}
	b.WriteString("simulators:\n" + c.Sims)
	if c.Pools == "" {
		c.Pools = "  - {name: p, backends: [{url: \"sim://gpu-a\"}]}\n"
	}
	b.WriteString("pools:\n" + c.Pools)
	if c.Routes == "" {
		c.Routes = "  - {name: main, path: /v1/, models: [sim-small], pool: p}\n"
	}
	b.WriteString("routes:\n" + c.Routes)
	return b.String()
}

func prefixComma(s string) string {
	if s == "" {
		return ""
	}
	return ", " + s
}

// tenant is a tenants list item with limits (flow style) and keys.
func tenant(id, limits string, keys ...string) string {
	hashes := make([]string, len(keys))
	for i, k := range keys {
		hashes[i] = proxy.HashKey(k)
	}
	return fmt.Sprintf("  - id: %s\n    keys: [%s]\n    limits: {%s}\n", id, strings.Join(hashes, ", "), limits)
}

// testNode is a node started from a config file in a temporary directory.
type testNode struct {
	t     testing.TB
	n     *node.Node
	dir   string
	file  string
	base  string // http://host:port of the proxy listener
	admin string // http://host:port of the admin listener
}

func startFileNode(t testing.TB, cfg string) *testNode {
	t.Helper()
	tn := &testNode{t: t, dir: t.TempDir()}
	tn.file = filepath.Join(tn.dir, "sluice.yaml")
	if err := os.WriteFile(tn.file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := configs.Load(tn.file)
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.Start(context.Background(), c, node.Options{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	tn.n = n
	t.Cleanup(func() {
		n.Shutdown()
		n.Close()
	})
	tn.base = "http://" + n.Server().Addr(listen.ListenerHTTP)
	tn.admin = "http://" + n.Server().Addr(listen.ListenerAdmin)
	return tn
}

// reloadStatus is the part of GET /debug/config the tests read.
type reloadStatus struct {
	LastAttempt *node.Result `json:"last_attempt"`
	Attempts    int64        `json:"reload_attempts"`
}

func (tn *testNode) reloadStatus() reloadStatus {
	tn.t.Helper()
	resp, err := http.Get(tn.admin + "/debug/config")
	if err != nil {
		tn.t.Fatal(err)
	}
	defer resp.Body.Close()
	var rs reloadStatus
	if err := json.NewDecoder(resp.Body).Decode(&rs); err != nil {
		tn.t.Fatalf("/debug/config: %v", err)
	}
	return rs
}

func configsHash(key string) string { return proxy.HashKey(key) }

func discardLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
