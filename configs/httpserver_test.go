package configs

import (
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/proxy/listen"
)

// TestHTTPServerConfig: listeners.http_server defaults to Sluice's own
// HTTP/1.1 server, takes "go" (net/http's), and refuses anything else.
func TestHTTPServerConfig(t *testing.T) {
	c, err := Parse("h1.yaml", []byte(valid))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Listeners.HTTPServer; got != listen.HTTPServerSluice {
		t.Fatalf("default http_server %q; want %q", got, listen.HTTPServerSluice)
	}
	head := "listeners:\n  http: 127.0.0.1:8080\n"
	rest := strings.TrimPrefix(valid, head)
	c, err = Parse("h1.yaml", []byte(head+"  http_server: go\n"+rest))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Listeners.HTTPServer; got != listen.HTTPServerGo {
		t.Fatalf("http_server %q; want %q", got, listen.HTTPServerGo)
	}
	wantErrors(t, head+"  http_server: nginx\n"+rest,
		`3:16: listeners.http_server: "nginx" is not "go" or "sluice"`)
}
