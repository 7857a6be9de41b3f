package configs

import (
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/proxy/listen"
)

// TestH2ServerConfig: listeners.h2_server defaults to net/http's server,
// takes "sluice", and refuses anything else.
func TestH2ServerConfig(t *testing.T) {
	c, err := Parse("h2.yaml", []byte(valid))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Listeners.H2Server; got != listen.H2ServerGo {
		t.Fatalf("default h2_server %q; want %q", got, listen.H2ServerGo)
	}
	head := "listeners:\n  http: 127.0.0.1:8080\n"
	rest := strings.TrimPrefix(valid, head)
	c, err = Parse("h2.yaml", []byte(head+"  h2_server: sluice\n"+rest))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Listeners.H2Server; got != listen.H2ServerSluice {
		t.Fatalf("h2_server %q; want %q", got, listen.H2ServerSluice)
	}
	wantErrors(t, head+"  h2_server: nginx\n"+rest,
		`3:14: listeners.h2_server: "nginx" is not "go" or "sluice"`)
}
