package configs

import (
	"path/filepath"
	"strings"
	"testing"
)

// The secrets of issue 16 item 12, each written in a style that the old
// pattern-based redaction (rewrite the value's first line) left visible.
const leakyConfig = `# operator note: the old redis password was hunter2-comment
node: {name: leak, region: &region region-copied-secret}
listeners: {http: "127.0.0.1:8080", admin: "127.0.0.1:9090"}
redis:
  addrs: ["127.0.0.1:6379"]
  password: &redispw "quoted-multi
    line-secret"
pools:
  - name: block
    api_key: |
      block-literal-secret
      second-line-secret
    backends: [{url: "http://alice:url-password@127.0.0.1:8001"}]
  - name: folded
    api_key: >-
      folded-secret
      continues-here
    backends:
      - url: http://127.0.0.1:8002   # api_key was sk-in-a-comment
  - {name: flow, api_key: flow-map-secret, backends: [{url: "http://bob:flow-url-pass@127.0.0.1:8003"}]}
  - name: copy
    api_key: *region
    backends: [{url: "http://127.0.0.1:8005"}]
  - name: alias
    api_key: *redispw
    backends: [{url: "http://127.0.0.1:8004", metrics_url: "http://m:metrics-pass@127.0.0.1:9004/metrics"}]
routes:
  - pool: block
`

func TestAttackRedactionLeaksSecrets(t *testing.T) {
	c, err := Parse("leak.yaml", []byte(leakyConfig))
	if err != nil {
		t.Fatal(err)
	}
	out := string(c.RedactedText())
	for _, secret := range []string{
		"hunter2-comment", "quoted-multi", "line-secret", "block-literal-secret", "second-line-secret",
		"folded-secret", "continues-here", "sk-in-a-comment", "flow-map-secret",
		"alice", "url-password", "bob", "flow-url-pass", "metrics-pass", "#", "region-copied-secret",
	} {
		if strings.Contains(out, secret) {
			t.Errorf("%q still shown in:\n%s", secret, out)
		}
	}
	r, err := Parse("leak.yaml", []byte(out))
	if err != nil {
		t.Fatalf("redacted text does not parse: %v\n%s", err, out)
	}
	if r.Redis.Password != Redacted {
		t.Errorf("redis.password %q; want %q", r.Redis.Password, Redacted)
	}
	for i, p := range r.Pools {
		if p.APIKey != Redacted {
			t.Errorf("pools[%d].api_key %q; want %q", i, p.APIKey, Redacted)
		}
	}
	if got, want := r.Pools[0].Backends[0].URL, "http://127.0.0.1:8001"; got != want {
		t.Errorf("backend URL %q; want %q (user info removed, the rest kept)", got, want)
	}
	if got, want := r.Pools[4].Backends[0].MetricsURL, "http://127.0.0.1:9004/metrics"; got != want {
		t.Errorf("metrics URL %q; want %q", got, want)
	}
	// Everything else survives: the text is the same config but for the
	// secrets (Compare treats Redacted as unknown; URLs lost their user).
	if r.Node.Name != "leak" || r.Listeners.Admin != "127.0.0.1:9090" || len(r.Pools) != 5 || len(r.Routes) != 1 {
		t.Errorf("redacted config lost values: %+v", r.Node)
	}
}

func TestRedactURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"http://u:p@host:1/x?y=1", "http://host:1/x?y=1"},
		{"https://token@host/", "https://host/"},
		{"http://127.0.0.1:8000", "http://127.0.0.1:8000"},
		{"user@example.com", "user@example.com"},
		{"sim://gpu-a", "sim://gpu-a"},
	} {
		if got := RedactURL(tc.in); got != tc.want {
			t.Errorf("RedactURL(%q) = %q; want %q", tc.in, got, tc.want)
		}
	}
}

// Every example config and the embedded default, shown redacted, parse
// again to the same config (no change but for secrets).
func TestRedactedExamplesRoundTrip(t *testing.T) {
	files, _ := filepath.Glob("examples/*.yaml")
	cfgs := []*Config{}
	for _, f := range files {
		c, err := Load(f)
		if err != nil {
			t.Fatal(err)
		}
		cfgs = append(cfgs, c)
	}
	def, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range append(cfgs, def) {
		out := c.RedactedText()
		r, err := ParseWith(c.File, out, func(string) ([]byte, error) { return c.FileTenants.RedactedText(), nil })
		if err != nil {
			t.Fatalf("%s: redacted text does not parse: %v\n%s", c.File, err, out)
		}
		if d := Compare(c, r); !d.Empty() {
			t.Errorf("%s: redacted text differs: %v", c.File, d.Lines())
		}
	}
}

// check -diff never prints URL user info, and a node's redacted URL is
// not a change against the file that has the credentials.
func TestAttackDiffShowsURLUserInfo(t *testing.T) {
	base := "listeners: {http: \"127.0.0.1:8080\"}\nroutes: [{pool: p}, {pool: q, path: /q/}]\npools:\n"
	oldCfg := base + "  - {name: p, backends: [{url: \"http://u:old-pass@10.0.0.1:8000\"}, {url: \"http://10.0.0.2:8000\"}]}\n" +
		"  - {name: q, backends: [{url: \"http://q:q-pass@10.0.0.9:8000\"}]}\n"
	newCfg := base + "  - {name: p, backends: [{url: \"http://u:new-pass@10.0.0.1:8000\", weight: 2}, {url: \"http://v:added-pass@10.0.0.3:8000\"}]}\n" +
		"  - {name: q, backends: [{url: \"http://q:q-pass@10.0.0.9:8000\"}]}\n  - {name: r, backends: [{url: \"http://r:r-pass@10.0.0.7:8000\"}]}\n"
	oc, err := Parse("old.yaml", []byte(oldCfg))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := Parse("new.yaml", []byte(newCfg))
	if err != nil {
		t.Fatal(err)
	}
	out := strings.Join(Compare(oc, nc).Lines(), "\n")
	for _, s := range []string{"old-pass", "new-pass", "added-pass", "r-pass", "u:", "v:", "r:"} {
		if strings.Contains(out, s) {
			t.Errorf("diff shows %q:\n%s", s, out)
		}
	}
	if !strings.Contains(out, "backend added http://10.0.0.3:8000") || !strings.Contains(out, "backend http://10.0.0.1:8000 url http://10.0.0.1:8000 → http://10.0.0.1:8000 (user info changed)") {
		t.Errorf("diff lost the backends:\n%s", out)
	}
	shown, err := Parse("node", oc.RedactedText())
	if err != nil {
		t.Fatal(err)
	}
	if d := Compare(shown, oc); !d.Empty() {
		t.Errorf("the node's redacted URLs show as changes: %v", d.Lines())
	}
}
