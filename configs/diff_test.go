package configs

import (
	"bytes"
	"strings"
	"testing"
)

const diffOld = `node: {name: fra1, region: eu, drain_timeout: 30s}
listeners: {http: 127.0.0.1:8080, admin: 127.0.0.1:9090}
redis: {addrs: ["127.0.0.1:6379"], password: s3cret}
tenants:
  - id: acme
    keys: [KEY0, KEY1]
    limits: {max_concurrency: 64, tokens_per_minute: 400000, requests_per_minute: 1200}
  - id: beta
    keys: [KEY2]
    limits: {tokens_per_minute: 1000}
  - id: gone
    keys: [KEY3]
pools:
  - name: sim
    api_key: backend-secret
    backends: [{url: "http://10.0.0.1:8000"}, {url: "http://10.0.0.2:8000"}]
  - name: old
    backends: [{url: "http://10.0.9.9:8000"}]
routes:
  - {name: openai, path: /v1/, models: [small], pool: sim}
  - {name: legacy, path: /legacy/, pool: old}
`

const diffNew = `node: {name: fra1, region: eu, drain_timeout: 1m}
listeners: {http: 127.0.0.1:8081, admin: 127.0.0.1:9090}
redis: {addrs: ["127.0.0.1:6379"], password: n3w}
proxy: {first_token_timeout: 30s}
tenants:
  - id: acme
    keys: [KEY0, KEY4]
    limits: {max_concurrency: 32, tokens_per_minute: 800000, models: {big: {tokens_per_minute: 5000}}}
  - id: beta
    keys: [KEY2]
    limits: {tokens_per_minute: 1000, enforce: false}
  - id: newco
    keys: [KEY5, KEY6]
pools:
  - name: sim
    api_key: other-secret
    eject_after: 5
    backends: [{url: "http://10.0.0.1:8000"}, {url: "http://10.0.0.3:8000", weight: 2}]
  - name: big
    backends: [{url: "http://10.0.1.1:8000"}]
routes:
  - {name: openai, path: /v1/, models: [small, large], pool: sim, enforce_limits: false}
  - {name: batch, path: /v1/batch/, pool: big, class: batch}
`

// withKeys replaces KEYn with valid key hashes.
func withKeys(s string) string {
	for i := 9; i >= 0; i-- {
		s = strings.ReplaceAll(s, "KEY"+string(rune('0'+i)), keyHash(i))
	}
	return s
}

func TestCompare(t *testing.T) {
	old, err := Parse("old.yaml", []byte(withKeys(diffOld)))
	if err != nil {
		t.Fatal(err)
	}
	cur, err := Parse("new.yaml", []byte(withKeys(diffNew)))
	if err != nil {
		t.Fatal(err)
	}
	d := Compare(old, cur)
	var b bytes.Buffer
	d.Write(&b)
	want := `changes ` + old.Version + ` → ` + cur.Version + `:
routes:
  + added "batch": path /v1/batch/, pool big
  - removed "legacy": path /legacy/, pool old
  ~ changed "openai": models [small] → [small large]; enforce_limits (default) → false
pools:
  + added "big": backends [http://10.0.1.1:8000]
  - removed "old": backends [http://10.0.9.9:8000]
  ~ changed "sim": backend removed http://10.0.0.2:8000; backend added http://10.0.0.3:8000; api_key (changed); eject_after 3 → 5
tenants:
  ~ "acme" keys: 1 added (` + shortHash(keyHash(4)) + `), 1 removed (` + shortHash(keyHash(1)) + `)
  - removed "gone" (1 key)
  + added "newco" (2 keys)
limits:
  ~ "acme" max_concurrency 64 → 32 (lowered)
  ~ "acme" tokens_per_minute 400000 → 800000 (raised)
  ~ "acme" requests_per_minute 1200 → unlimited (raised)
  ~ "acme" models.big (none) → {tokens_per_minute: 5000}
  ~ "beta" enforce true → false (shadow mode: reported, not enforced)
proxy:
  ~ first_token_timeout 1m0s → 30s
node:
  ~ drain_timeout 30s → 1m0s
restart required:
  listeners.http 127.0.0.1:8080 → 127.0.0.1:8081
  redis.password (changed)
`
	if got := b.String(); got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
	if got := strings.Join(d.RestartRequired, ","); got != "listeners.http,redis.password" {
		t.Fatalf("restart required %q", got)
	}
	if strings.Contains(b.String(), "s3cret") || strings.Contains(b.String(), "backend-secret") || strings.Contains(b.String(), keyHash(1)) {
		t.Fatal("the diff shows a secret or a whole key hash")
	}

	// The same config: no changes; a redacted secret is not a change.
	if d := Compare(old, old); !d.Empty() {
		t.Fatalf("self diff: %v", d.Lines())
	}
	red, err := Parse("remote", []byte(strings.NewReplacer("s3cret", Redacted, "backend-secret", Redacted).Replace(withKeys(diffOld))))
	if err != nil {
		t.Fatal(err)
	}
	if d := Compare(red, old); !d.Empty() {
		t.Fatalf("redacted diff: %v", d.Lines())
	}
}

func TestRedactedText(t *testing.T) {
	text := "# ünïcode comment\nredis:\n  addrs: [\"127.0.0.1:6379\"]\n  password: \"p@ss: word\"\n" +
		"pools:\n  - {name: a, api_key: k-1, backends: [{url: \"http://127.0.0.1:1\"}]}\n" +
		"  - name: b\n    api_key: 'k''2'\n    backends: [{url: \"http://127.0.0.1:2\"}]\n" +
		"  - name: c\n    api_key: \"k\\u0033\"\n    backends: [{url: \"http://127.0.0.1:3\"}]\n" +
		"listeners: {http: \"127.0.0.1:8080\"}\nroutes:\n  - pool: a\n"
	c, err := Parse("s.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	out := c.RedactedText()
	for _, secret := range []string{"p@ss", "k-1", "k''2", "k\\u0033"} {
		if bytes.Contains(out, []byte(secret)) {
			t.Fatalf("%q still in:\n%s", secret, out)
		}
	}
	r, err := Parse("s.yaml", out)
	if err != nil {
		t.Fatalf("redacted text does not parse: %v\n%s", err, out)
	}
	if r.Redis.Password != Redacted || r.Pools[0].APIKey != Redacted || r.Pools[1].APIKey != Redacted || r.Pools[2].APIKey != Redacted {
		t.Fatalf("redacted values: %q %q %q %q", r.Redis.Password, r.Pools[0].APIKey, r.Pools[1].APIKey, r.Pools[2].APIKey)
	}
	if d := Compare(r, c); !d.Empty() {
		t.Fatalf("redaction shows as a change: %v", d.Lines())
	}
}
