package configs

import (
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/proxy/listen"
)

// TestH2ServerConfig: listeners.h2_server defaults to Sluice's own
// server, takes "go" (net/http's), and refuses anything else.
func TestH2ServerConfig(t *testing.T) {
	c, err := Parse("h2.yaml", []byte(valid))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Listeners.H2Server; got != listen.H2ServerSluice {
		t.Fatalf("default h2_server %q; want %q", got, listen.H2ServerSluice)
	}
	head := "listeners:\n  http: 127.0.0.1:8080\n"
	rest := strings.TrimPrefix(valid, head)
	c, err = Parse("h2.yaml", []byte(head+"  h2_server: go\n"+rest))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Listeners.H2Server; got != listen.H2ServerGo {
		t.Fatalf("h2_server %q; want %q", got, listen.H2ServerGo)
	}
	wantErrors(t, head+"  h2_server: nginx\n"+rest,
		`3:14: listeners.h2_server: "nginx" is not "go" or "sluice"`)
}
