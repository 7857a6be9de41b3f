package configs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestDefaultLoads(t *testing.T) {
	c, err := Default()
	if err != nil {
		t.Fatalf("embedded default: %v", err)
	}
	if c.Listeners.HTTP != "127.0.0.1:8080" || c.Listeners.HTTPS == nil || c.Listeners.HTTPS.Addr != "127.0.0.1:8443" ||
		c.Listeners.Admin != "127.0.0.1:9090" {
		t.Errorf("listeners %+v; want 8080, 8443 and 9090 on loopback", c.Listeners)
	}
	if len(c.Simulators) != 2 || len(c.Tenants) != 1 || c.Routes[0].Models[0] != "sim-small" {
		t.Errorf("default config: %d simulators, %d tenants, routes %+v", len(c.Simulators), len(c.Tenants), c.Routes)
	}
	if c.Proxy.MaxBodyBytes != 1<<20 || c.Node.DrainTimeout != 10*time.Second {
		t.Errorf("defaults not applied: max_body_bytes %d, drain %v", c.Proxy.MaxBodyBytes, c.Node.DrainTimeout)
	}
}

func TestExamplesLoad(t *testing.T) {
	files, err := filepath.Glob("examples/*.yaml")
	if err != nil || len(files) < 2 {
		t.Fatalf("examples: %v %v", files, err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			if _, err := Load(f); err != nil {
				t.Fatalf("%v", err)
			}
		})
	}
}

const valid = `listeners:
  http: 127.0.0.1:8080
pools:
  - name: p
    backends:
      - url: http://127.0.0.1:8000
routes:
  - pool: p
`

func TestErrorsHaveLineAndColumn(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       []string // each "line:col: substring"
	}{
		{"broken yaml", "listeners:\n  http: [127.0.0.1\n", []string{"2:9: "}},
		{"tab indent", "listeners:\n\thttp: x\n", []string{"2:"}},
		{"unknown key", strings.Replace(valid, "  - pool: p\n", "  - pool: p\n    modle: x\n", 1),
			[]string{`9:5: unknown key "modle" in routes[0] (did you mean "models"?)`}},
		{"unknown top-level key", valid + "tenant: []\n", []string{`9:1: unknown key "tenant" in config (did you mean "tenants"?)`}},
		{"bad duration", valid + "proxy:\n  first_token_timeout: 30\n", []string{`10:24: proxy.first_token_timeout: bad duration "30"`}},
		{"negative duration", valid + "proxy:\n  dial_timeout: -1s\n", []string{`10:17: proxy.dial_timeout: duration "-1s" must not be negative`}},
		{"bad size", valid + "proxy:\n  max_body_bytes: 1 lightyear\n", []string{"10:19: proxy.max_body_bytes: bad size"}},
		{"missing pool", strings.Replace(valid, "  - pool: p\n", "  - pool: nope\n", 1),
			[]string{`8:11: routes[0]: pool "nope" is not defined in pools`}},
		{"wrong type", valid + "proxy:\n  retries: many\n", []string{`10:12: proxy.retries: expected a whole number, got "many"`}},
		{"list for map", "node: [a]\n" + valid, []string{"1:7: node: expected a mapping"}},
		{"duplicate key", "node:\n  name: a\n  name: b\n" + valid, []string{`3:3: mapping key "name" already defined`}},
		{"several errors", `listeners:
  http: nonsense
pools:
  - name: p
    backends: []
routes:
  - pool: p
    class: fast
tenants:
  - id: a
    keys: [sk-plaintext]
`, []string{
			`2:9: listeners.http: bad listen address "nonsense"`,
			`4:5: pool "p": at least one backend is required`,
			`8:12: routes[0]: class "fast" must be interactive or batch`,
			`11:12: tenant "a": key must be a hash`,
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("test.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatal("no error")
			}
			errs := Errors(err)
			var lines []string
			for _, e := range errs {
				lines = append(lines, e.Error())
			}
			got := strings.Join(lines, "\n")
			for _, w := range tc.want {
				if !strings.Contains(got, "test.yaml:"+w) {
					t.Errorf("errors:\n%s\nwant one containing %q", got, "test.yaml:"+w)
				}
			}
			if len(errs) != len(tc.want) {
				t.Errorf("got %d errors; want %d:\n%s", len(errs), len(tc.want), got)
			}
		})
	}
}

func TestValidMinimalConfig(t *testing.T) {
	c, err := Parse("min.yaml", []byte(valid))
	if err != nil {
		t.Fatal(err)
	}
	r := c.Routes[0]
	if r.Path != "/v1/" || r.Class != "interactive" || r.Kind != "openai" {
		t.Errorf("route defaults: %+v", r)
	}
	if c.Pools[0].EjectAfter != 3 || c.Pools[0].Backends[0].Weight != 1 {
		t.Errorf("pool defaults: %+v", c.Pools[0])
	}
}

func TestAnchorsAndAliases(t *testing.T) {
	y := valid + `tenants:
  - id: a
    keys: [sha256:246c6a889938d703aa7ba351c2a6abcbba304db0c338c25b9939a23cafb13851]
    limits: &std
      max_concurrency: 4
  - id: b
    keys: [sha256:ef689e186280cc877d8e1e52f0f160abf02f87bbf9450a91b1aa2a1ea2d3d7e7]
    limits: *std
`
	c, err := Parse("a.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	if c.Tenants[1].Limits.MaxConcurrency != 4 {
		t.Fatalf("alias not resolved: %+v", c.Tenants[1].Limits)
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if err == nil || !strings.Contains(err.Error(), "nope.yaml") {
		t.Fatalf("got %v; want an error naming the file", err)
	}
}

func TestCertificateErrorsPointAtEntry(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "junk.crt"), []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	y := "listeners:\n  https:\n    addr: 127.0.0.1:8443\n    certificates:\n      - cert_file: " + dir + "/junk.crt\n        key_file: " + dir + "/missing.key\n" +
		strings.TrimPrefix(valid, "listeners:\n")
	_, err := Parse("c.yaml", []byte(y))
	if err == nil {
		t.Fatal("no error for a broken certificate entry")
	}
	if got := err.Error(); !strings.Contains(got, "c.yaml:5:9: listeners.https.certificates[0]: ") {
		t.Fatalf("got %q; want the error at the certificate entry", got)
	}
}

func TestWebSocketConfig(t *testing.T) {
	c, err := Parse("ws.yaml", []byte(valid))
	if err != nil {
		t.Fatal(err)
	}
	ws := c.Proxy.WebSocket
	if !*ws.Enabled || ws.Path != "/v1/ws" || ws.MaxInflight != 16 || ws.SendQueue != 64 ||
		ws.SlowClientDeadline != 10*time.Second || ws.PingInterval != 25*time.Second ||
		ws.IdleTimeout != 5*time.Minute || ws.MaxMessageBytes != 1<<20+64<<10 || len(ws.AllowedOrigins) != 0 {
		t.Errorf("websocket defaults: %+v", ws)
	}

	y := valid + `  - path: /v1/realtime
    kind: websocket
    pool: p
proxy:
  max_body_bytes: 2MiB
  websocket:
    path: /ws
    max_inflight: 4
    send_queue: 8
    slow_client_deadline: 2s
    ping_interval: 10s
    idle_timeout: 1m
    allowed_origins: ["https://app.example.com", "https://*.example.com", "http://localhost:3000", "*"]
`
	c, err = Parse("ws.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	ws = c.Proxy.WebSocket
	if ws.Path != "/ws" || ws.MaxInflight != 4 || ws.SendQueue != 8 || ws.SlowClientDeadline != 2*time.Second ||
		ws.PingInterval != 10*time.Second || ws.IdleTimeout != time.Minute || len(ws.AllowedOrigins) != 4 ||
		ws.MaxMessageBytes != 2<<20+64<<10 {
		t.Errorf("websocket config: %+v", ws)
	}
	if c.Routes[1].Kind != "websocket" {
		t.Errorf("route kind %q; want websocket", c.Routes[1].Kind)
	}
}

func TestWebSocketConfigErrors(t *testing.T) {
	y := valid + `  - path: /v1/realtime
    kind: websocket
    models: [m]
    pool: p
proxy:
  websocket:
    path: ws
    max_inflight: -1
    allowed_origins: ["app.example.com", "https://a.example.com/path", "ftp://x"]
`
	_, err := Parse("ws.yaml", []byte(y))
	if err == nil {
		t.Fatal("no error")
	}
	var lines []string
	for _, e := range Errors(err) {
		lines = append(lines, e.Error())
	}
	got := strings.Join(lines, "\n")
	for _, w := range []string{
		`ws.yaml:11:13: routes[1]: a websocket route cannot match models`,
		`ws.yaml:15:11: proxy.websocket.path: "ws" must start with /`,
		`ws.yaml:16:19: proxy.websocket.max_inflight: must not be negative`,
		`ws.yaml:17:23: proxy.websocket.allowed_origins[0]: "app.example.com" is not an origin`,
		`ws.yaml:17:42: proxy.websocket.allowed_origins[1]`,
		`ws.yaml:17:72: proxy.websocket.allowed_origins[2]`,
	} {
		if !strings.Contains(got, w) {
			t.Errorf("errors:\n%s\nwant one containing %q", got, w)
		}
	}
	if len(lines) != 6 {
		t.Errorf("got %d errors; want 6:\n%s", len(lines), got)
	}

	_, err = Parse("ws.yaml", []byte(valid+"  - path: /v1/ws\n    pool: p\n"))
	if err == nil || !strings.Contains(err.Error(), `ws.yaml:9:11: routes[1]: path "/v1/ws" is the WebSocket bridge endpoint`) {
		t.Errorf("got %v; want the route shadowed by the bridge reported at its path", err)
	}
}
