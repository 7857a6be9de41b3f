package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Cluster is a real Redis Cluster of primaries without replicas.
type Cluster struct {
	// Servers are the cluster's primaries.
	Servers []*Server
}

// StartCluster starts n (at least 3) redis-server processes in cluster mode,
// joins them with redis-cli --cluster create, and waits until every node
// reports cluster_state:ok. The processes stop when the test ends.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	if n < 3 {
		tb.Fatalf("redistest: a cluster needs at least 3 primaries, got %d", n)
	}
	c := &Cluster{}
	for i := 0; i < n; i++ {
		s := start(tb, []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000",
		}, true)
		c.Servers = append(c.Servers, s)
	}
	if err := c.create(); err != nil {
		tb.Fatalf("redistest: creating cluster: %v", err)
	}
	if err := c.waitOK(30 * time.Second); err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	return c
}

// Addrs are the primaries' addresses.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Servers))
	for i, s := range c.Servers {
		addrs[i] = s.Addr()
	}
	return addrs
}

func (c *Cluster) create() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.CommandContext(ctx, CLIBinary, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s --cluster create: %w: %s", CLIBinary, err, out)
	}
	return nil
}

// waitOK waits until every node says cluster_state:ok and knows all nodes.
func (c *Cluster) waitOK(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ok := true
		var last string
		for _, s := range c.Servers {
			info, err := s.Do("CLUSTER", "INFO")
			if err != nil || !strings.Contains(info, "cluster_state:ok") ||
				!strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", len(c.Servers))) {
				ok, last = false, info
				break
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster not ok after %v: %q", timeout, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
