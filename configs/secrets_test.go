package configs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// secretsConfig takes every secret from a file or the environment.
const secretsConfig = `listeners:
  http: 127.0.0.1:8080
redis:
  addrs: ["127.0.0.1:6379"]
  password_file: redis.pw
pools:
  - name: p
    api_key_file: keys/pool.key
    backends:
      - url: http://127.0.0.1:8000
  - name: q
    api_key: ${env:SLUICE_TEST_Q_KEY}
    backends:
      - url: http://127.0.0.1:8001
routes:
  - pool: p
tracing:
  headers:
    authorization: ${file:collector.token}
    x-api-key: ${env:SLUICE_TEST_COLLECTOR_KEY}
`

// writeSecretsDir writes secretsConfig and its secret files into a new
// directory and returns the config's path.
func writeSecretsDir(t *testing.T, poolKey string) string {
	t.Helper()
	dir := t.TempDir()
	writeSecret(t, filepath.Join(dir, "redis.pw"), "redis-pw-from-file\n")
	os.MkdirAll(filepath.Join(dir, "keys"), 0o700)
	writeSecret(t, filepath.Join(dir, "keys/pool.key"), "  "+poolKey+"\n")
	writeSecret(t, filepath.Join(dir, "collector.token"), "Bearer collector-from-file\n")
	path := filepath.Join(dir, "sluice.yaml")
	writeSecret(t, path, secretsConfig)
	return path
}

func writeSecret(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Load reads every kind of secret source (files relative to the config,
// ${file:}, ${env:}), trims the files' white space, and neither the
// redacted text nor a diff ever shows a value.
func TestSecretsFromFilesAndEnvironment(t *testing.T) {
	t.Setenv("SLUICE_TEST_Q_KEY", "q-key-from-env")
	t.Setenv("SLUICE_TEST_COLLECTOR_KEY", "collector-key-from-env")
	path := writeSecretsDir(t, "pool-key-one")
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Redis.Password != "redis-pw-from-file" || c.Pools[0].APIKey != "pool-key-one" || c.Pools[1].APIKey != "q-key-from-env" ||
		c.Tracing.Headers["authorization"] != "Bearer collector-from-file" || c.Tracing.Headers["x-api-key"] != "collector-key-from-env" {
		t.Fatalf("secrets not resolved: redis %q, pools %q %q, headers %v",
			c.Redis.Password, c.Pools[0].APIKey, c.Pools[1].APIKey, c.Tracing.Headers)
	}
	out := string(c.RedactedText())
	for _, s := range []string{"redis-pw-from-file", "pool-key-one", "q-key-from-env", "collector-from-file", "collector-key-from-env", "SLUICE_TEST"} {
		if strings.Contains(out, s) {
			t.Errorf("redacted text shows %q:\n%s", s, out)
		}
	}
	if !strings.Contains(out, "api_key_file: keys/pool.key") {
		t.Errorf("the file's name (not a secret) is not shown:\n%s", out)
	}

	// Parse alone (a config fetched from a node) reads nothing: the
	// referenced secrets are unknown.
	p, err := Parse(path, []byte(secretsConfig))
	if err != nil {
		t.Fatal(err)
	}
	if p.Redis.Password != Redacted || p.Pools[0].APIKey != Redacted || p.Pools[1].APIKey != Redacted || p.Tracing.Headers["x-api-key"] != Redacted {
		t.Fatalf("Parse resolved secrets: %q %q %q %v", p.Redis.Password, p.Pools[0].APIKey, p.Pools[1].APIKey, p.Tracing.Headers)
	}
}

// A rotated file is read again by the next Load (every reload and
// `sluice check` loads), and the diff says that the key changed, never
// what it was or became.
func TestSecretFileRotationShowsOnlyThatItChanged(t *testing.T) {
	t.Setenv("SLUICE_TEST_Q_KEY", "q-key-from-env")
	t.Setenv("SLUICE_TEST_COLLECTOR_KEY", "collector-key-one")
	path := writeSecretsDir(t, "pool-key-one")
	old, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	writeSecret(t, filepath.Join(filepath.Dir(path), "keys/pool.key"), "pool-key-two\n")
	t.Setenv("SLUICE_TEST_COLLECTOR_KEY", "collector-key-two")
	cur, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if cur.Pools[0].APIKey != "pool-key-two" {
		t.Fatalf("rotated key not read: %q", cur.Pools[0].APIKey)
	}
	var b strings.Builder
	Compare(old, cur).Write(&b)
	out := b.String()
	for _, s := range []string{"pool-key-one", "pool-key-two", "collector-key-one", "collector-key-two"} {
		if strings.Contains(out, s) {
			t.Errorf("diff shows %q:\n%s", s, out)
		}
	}
	for _, want := range []string{`~ changed "p": api_key (changed)`, "tracing.headers.x-api-key (changed)"} {
		if !strings.Contains(out, want) {
			t.Errorf("diff lacks %q:\n%s", want, out)
		}
	}

	// Against a running node's redacted config (check -diff URL), the
	// unknown secrets are not reported as changes.
	remote, err := ParseWith("http://127.0.0.1:9090", cur.RedactedText(), ReadFile)
	if err != nil {
		t.Fatal(err)
	}
	if d := Compare(remote, cur); !d.Empty() {
		t.Errorf("diff against the node's own redacted config is not empty: %v", d.Lines())
	}
}

// Every tracing.headers value is a secret in a diff, whatever the header
// is called (the old diff hid only keys named password and api_key and
// printed "tracing.headers.x-api-key old → new").
func TestAttackDiffShowsTracingHeaderValues(t *testing.T) {
	a, err := Parse("a.yaml", []byte(valid+"tracing:\n  headers: {x-api-key: collector-secret-one}\n"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Parse("b.yaml", []byte(valid+"tracing:\n  headers: {x-api-key: collector-secret-two, x-new: added-secret}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	Compare(a, b).Write(&sb)
	out := sb.String()
	for _, s := range []string{"collector-secret-one", "collector-secret-two", "added-secret"} {
		if strings.Contains(out, s) {
			t.Errorf("diff shows %q:\n%s", s, out)
		}
	}
	if !strings.Contains(out, "tracing.headers.x-api-key (changed)") || !strings.Contains(out, "tracing.headers.x-new (changed)") {
		t.Errorf("diff does not say the headers changed:\n%s", out)
	}
}

// A missing or empty file, an unset variable, a value and a file for the
// same secret and a misspelt reference are config errors at the key.
func TestSecretErrorsHaveLineAndColumn(t *testing.T) {
	dir := t.TempDir()
	writeSecret(t, filepath.Join(dir, "empty.key"), " \n")
	writeSecret(t, filepath.Join(dir, "two-lines.key"), "sk-part-one\nX-Injected: yes\n")
	writeSecret(t, filepath.Join(dir, "big.key"), strings.Repeat("k", MaxSecretBytes+1))
	os.Unsetenv("SLUICE_TEST_UNSET")
	cases := []struct {
		name, yaml string
		want       string // "line:col: substring"
	}{
		{"missing file", strings.Replace(valid, "  - name: p\n", "  - name: p\n    api_key_file: nope.key\n", 1),
			"5:19: pools[0].api_key_file: open " + filepath.Join(dir, "nope.key")},
		{"empty file", strings.Replace(valid, "  - name: p\n", "  - name: p\n    api_key_file: empty.key\n", 1),
			"5:19: pools[0].api_key_file: " + filepath.Join(dir, "empty.key") + " holds no secret"},
		{"two lines", strings.Replace(valid, "  - name: p\n", "  - name: p\n    api_key_file: two-lines.key\n", 1),
			"5:19: pools[0].api_key_file: " + filepath.Join(dir, "two-lines.key") + " holds a control character"},
		{"too large", strings.Replace(valid, "  - name: p\n", "  - name: p\n    api_key_file: big.key\n", 1),
			"5:19: pools[0].api_key_file: " + filepath.Join(dir, "big.key") + " is larger than 65536 bytes"},
		{"unset variable", strings.Replace(valid, "  - name: p\n", "  - name: p\n    api_key: ${env:SLUICE_TEST_UNSET}\n", 1),
			"5:14: pools[0].api_key: environment variable SLUICE_TEST_UNSET is not set"},
		{"missing ${file:}", valid + "tracing:\n  headers:\n    authorization: ${file:/nonexistent/sluice-token}\n",
			"11:20: tracing.headers.authorization: open /nonexistent/sluice-token"},
		{"redis file", valid + "redis:\n  addrs: [127.0.0.1:6379]\n  password_file: nope.pw\n",
			"11:18: redis.password_file: open " + filepath.Join(dir, "nope.pw")},
		{"both", strings.Replace(valid, "  - name: p\n", "  - name: p\n    api_key: inline\n    api_key_file: empty.key\n", 1),
			"6:19: pools[0].api_key_file: set either api_key or api_key_file, not both"},
		{"misspelt", strings.Replace(valid, "  - name: p\n", "  - name: p\n    api_key: ${ENV:X}\n", 1),
			`5:14: pools[0].api_key: "${ENV:X}" is neither ${env:NAME} nor ${file:PATH}`},
		{"bad name", strings.Replace(valid, "  - name: p\n", "  - name: p\n    api_key: ${env:1-X}\n", 1),
			`5:14: pools[0].api_key: "1-X" is not an environment variable name`},
		{"redis file without addrs", valid + "redis:\n  password_file: x\n", "10:3: redis: addrs is required"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, "test.yaml")
			writeSecret(t, path, tc.yaml)
			_, err := Load(path)
			if err == nil {
				t.Fatal("no error")
			}
			errs := Errors(err)
			if len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), path+":"+tc.want) {
				t.Fatalf("errors %v\nwant one starting %q", errs, path+":"+tc.want)
			}
		})
	}
}

// Keys that end like a secret's name (a sentinel_password, a
// client_secret another section adds) are redacted and hidden in diffs
// too; *_file keys and look-alikes (max_tokens, prefill_per_token) are
// not.
func TestSecretKeySuffixes(t *testing.T) {
	out := string(RedactYAML([]byte("redis:\n  sentinel_password: s3nt1nel\n  password_file: /run/pw\nacme:\n  eab: {client_secret: cl13nt, hmac_api_key: hm4c}\nproxy: {max_tokens: 100}\nsimulators: [{prefill_per_token: 7ms}]\n")))
	for _, s := range []string{"s3nt1nel", "cl13nt", "hm4c"} {
		if strings.Contains(out, s) {
			t.Errorf("%q shown:\n%s", s, out)
		}
	}
	for _, s := range []string{"/run/pw", "max_tokens: 100", "prefill_per_token: 7ms"} {
		if !strings.Contains(out, s) {
			t.Errorf("%q not shown:\n%s", s, out)
		}
	}
	for path, want := range map[string]bool{"redis.sentinel_password": true, "tracing.headers.x": true, "pools[0].api_key": true,
		"redis.password_file": false, "pools[0].api_key_file": false, "proxy.max_tokens": false, "admin.token_file": false, "simulators[0].prefill_per_token": false} {
		if secretPath(path) != want {
			t.Errorf("secretPath(%q) = %v; want %v", path, !want, want)
		}
	}
}
