package configs

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// keyHash is a valid key hash for tenant i.
func keyHash(i int) string {
	h := sha256.Sum256([]byte(fmt.Sprint("key-", i)))
	return "sha256:" + hex.EncodeToString(h[:])
}

// genTenants writes n tenants the way a generator would.
func genTenants(n int) []byte {
	var b strings.Builder
	b.WriteString("# generated\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "- id: tenant-%d\n  keys: [%s]\n  limits:\n    max_concurrency: 8\n    tokens_per_minute: 100000\n    requests_per_minute: 600\n", i, keyHash(i))
	}
	return []byte(b.String())
}

func BenchmarkLoadTenants100k(b *testing.B) {
	data := genTenants(100_000)
	path := filepath.Join(b.TempDir(), "tenants.yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		s, err := LoadTenants(path)
		if err != nil || len(s.Tenants) != 100_000 {
			b.Fatalf("%v", err)
		}
	}
}

// Both readers of a tenants file agree on every construct the fast one
// reads.
func TestTenantsFastPathMatchesGeneral(t *testing.T) {
	k0, k1 := keyHash(0), keyHash(1)
	docs := map[string]string{
		"compact":  "- id: a\n  keys: [" + k0 + ", '" + k1 + "']\n  limits: {}\n",
		"flow map": "- id: a\n  keys: [" + k0 + "]\n  limits: {max_concurrency: 2, tokens_per_minute: 10 , enforce: }\n",
		"block lists and comments": `# tenants
---
- id: a   # the first
  keys:
    - ` + k0 + `
    - "` + k1 + `"
  limits:
    max_concurrency: 8
    tokens_per_minute: 1_000
    enforce: false
    on_store_failure: 'open'
    models:
      big model:
        tokens_per_minute: 5
      "small":
        requests_per_minute: 0x10
`,
		"dash alone":            "-\n  id: a\n  keys: [" + k0 + "]\n",
		"wrapped":               "tenants:\n- id: a\n  keys:\n  - " + k0 + "\n  limits:\n",
		"wrapped and indented":  "tenants:\n  - id: 'it''s'\n    keys: [ " + k0 + " ]\n",
		"nulls":                 "- id: a\n  keys: [" + k0 + "]\n  limits: ~\n",
		"crlf":                  "- id: a\r\n  keys: [" + k0 + "]\r\n",
		"empty":                 "",
		"comment only":          "# nothing yet\n",
		"empty list in wrapper": "tenants: []\n",
	}
	for name, doc := range docs {
		t.Run(name, func(t *testing.T) {
			root, err := fastParse("t.yaml", []byte(doc))
			if err != nil {
				t.Fatalf("fast path: %v", err)
			}
			fast := &TenantSet{File: "t.yaml"}
			if errs := fast.decodeFast(root); len(errs) > 0 {
				t.Fatalf("fast decode: %v", errs)
			}
			gen := &TenantSet{File: "t.yaml"}
			if errs := gen.decodeGeneral([]byte(doc)); len(errs) > 0 {
				t.Fatalf("general decode: %v", errs)
			}
			if !reflect.DeepEqual(fast.Tenants, gen.Tenants) {
				t.Fatalf("fast %+v\ngeneral %+v", fast.Tenants, gen.Tenants)
			}
		})
	}
}

// YAML the fast path does not read goes to the general parser, with the
// same result.
func TestTenantsFallback(t *testing.T) {
	k0, k1 := keyHash(0), keyHash(1)
	docs := []string{
		"- id: a\n  keys: [" + k0 + "]\n  limits: &l\n    max_concurrency: 2\n- id: b\n  keys: [" + k1 + "]\n  limits: *l\n",
		"- {id: a, keys: [\"" + k0 + "\"], limits: {max_concurrency: 2}}\n",
		"- id: >-\n    a\n  keys: [" + k0 + "]\n",
		"- id: \"\\u0061\"\n  keys: [" + k0 + "]\n",
	}
	for i, doc := range docs {
		if _, err := fastParse("t.yaml", []byte(doc)); err != errUnsupported {
			t.Errorf("doc %d: fast path said %v; want errUnsupported", i, err)
		}
		s, err := ParseTenants("t.yaml", []byte(doc))
		if err != nil {
			t.Fatalf("doc %d: %v", i, err)
		}
		if s.Tenants[0].ID != "a" || s.Tenants[0].Keys[0] != k0 {
			t.Errorf("doc %d: %+v", i, s.Tenants)
		}
	}
}

func TestTenantsFileErrors(t *testing.T) {
	k0 := keyHash(0)
	cases := []struct {
		name, doc string
		want      []string
	}{
		{"unknown key", "- id: a\n  keys: [" + k0 + "]\n  limts: {}\n",
			[]string{`t.yaml:3:3: unknown key "limts" in tenants[0] (did you mean "limits"?)`}},
		{"bad number", "- id: a\n  keys: [" + k0 + "]\n  limits:\n    max_concurrency: lots\n",
			[]string{`t.yaml:4:22: tenants[0].limits.max_concurrency: expected a whole number, got "lots"`}},
		{"plain key", "- id: a\n  keys:\n    - sk-live-123\n",
			[]string{`t.yaml:3:7: tenant "a": key must be a hash`}},
		{"duplicate id", "- id: a\n  keys: [" + k0 + "]\n- id: a\n  keys: [" + keyHash(1) + "]\n",
			[]string{`t.yaml:3:7: tenants[1]: duplicate tenant id "a"`}},
		{"duplicate key hash", "- id: a\n  keys: [" + k0 + "]\n- id: b\n  keys: [" + k0 + "]\n",
			[]string{`t.yaml:4:10: tenant "b": key hash already belongs to tenant "a"`}},
		{"duplicate mapping key", "- id: a\n  id: b\n  keys: [" + k0 + "]\n",
			[]string{`t.yaml:2:3: mapping key "id" already defined`}},
		{"tab", "- id: a\n\tkeys: [" + k0 + "]\n", []string{`t.yaml:2:1: found a tab character`}},
		{"bad limits", "- id: a\n  keys: [" + k0 + "]\n  limits:\n    max_concurrency: -1\n",
			[]string{`t.yaml:4:5: tenants[0].limits: `}},
		{"missing id", "- keys: [" + k0 + "]\n", []string{`t.yaml:1:3: tenants[0]: id is required`}},
		{"not a list", "tenant: []\n", []string{`t.yaml:1:1: unknown key "tenant" in tenants file`}},
		{"general path error", "- id: a\n  keys: [" + k0 + "]\n  limits: &l {max_concurrency: x}\n",
			[]string{`t.yaml:3:32: tenants[0].limits.max_concurrency: expected a whole number`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseTenants("t.yaml", []byte(c.doc))
			if err == nil {
				t.Fatal("no error")
			}
			errs := Errors(err)
			if len(errs) != len(c.want) {
				t.Fatalf("got %d errors %v; want %d", len(errs), errs, len(c.want))
			}
			for i, w := range c.want {
				if !strings.HasPrefix(errs[i].Error(), w) {
					t.Errorf("got %q; want prefix %q", errs[i].Error(), w)
				}
			}
		})
	}
}

// A config's tenants_file is read relative to the config, its tenants
// join the inline ones, and an id or key in both places is an error at the
// tenants file's position.
func TestConfigTenantsFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	inline := "tenants:\n  - id: a\n    keys: [" + keyHash(0) + "]\ntenants_file: more/tenants.yaml\n"
	cfgPath := write("sluice.yaml", valid+inline)
	os.Mkdir(filepath.Join(dir, "more"), 0o700)
	tpath := write("more/tenants.yaml", "- id: b\n  keys: ["+keyHash(1)+"]\n")
	c, err := Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	all := c.AllTenants()
	if len(all) != 2 || all[0].ID != "a" || all[1].ID != "b" || c.FileTenants.File != tpath {
		t.Fatalf("tenants %+v from %q", all, c.FileTenants.File)
	}
	if len(c.Version) != 12 || c.FileTenants.Version != Version([]byte("- id: b\n  keys: ["+keyHash(1)+"]\n")) {
		t.Fatalf("versions %q %q", c.Version, c.FileTenants.Version)
	}

	write("more/tenants.yaml", "- id: c\n  keys: ["+keyHash(2)+"]\n- id: a\n  keys: ["+keyHash(0)+"]\n")
	_, err = Load(cfgPath)
	got := fmt.Sprint(Errors(err))
	for _, w := range []string{
		tpath + `:3:7: tenants[1]: tenant id "a" is also defined in ` + cfgPath,
		tpath + `:4:10: tenant "a": key hash already belongs to tenant "a" in ` + cfgPath,
	} {
		if !strings.Contains(got, w) {
			t.Errorf("errors %s\nlack %q", got, w)
		}
	}

	// WithTenants swaps the file's tenants and checks them the same way.
	s, err := ParseTenants(tpath, []byte("- id: d\n  keys: ["+keyHash(3)+"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	c2, err := c.WithTenants(s)
	if err != nil || c2.AllTenants()[1].ID != "d" || c.AllTenants()[1].ID != "b" {
		t.Fatalf("WithTenants: %v", err)
	}
	clash, _ := ParseTenants(tpath, []byte("- id: a\n  keys: ["+keyHash(4)+"]\n"))
	if _, err := c.WithTenants(clash); err == nil || !strings.Contains(err.Error(), "also defined in") {
		t.Fatalf("WithTenants with a clashing id: %v", err)
	}

	os.Remove(tpath)
	_, err = Load(cfgPath)
	if err == nil || !strings.HasPrefix(err.Error(), cfgPath+":12:15: tenants_file: ") {
		t.Fatalf("missing tenants file: %v", err)
	}
}

// Whatever the fast path accepts, the general parser reads the same way.
func FuzzTenantsFastPath(f *testing.F) {
	k0 := keyHash(0)
	f.Add("- id: a\n  keys: [" + k0 + "]\n  limits:\n    max_concurrency: 8\n")
	f.Add("tenants:\n- id: 'x''y'\n  keys:\n  - \"" + k0 + "\"\n  limits: {burst: 5}\n")
	f.Add("-\n  id: a # c\n  limits:\n    models:\n      m:\n        enforce: false\n")
	f.Fuzz(func(t *testing.T, doc string) {
		root, err := fastParse("t.yaml", []byte(doc))
		if err != nil {
			return
		}
		fast := &TenantSet{File: "t.yaml"}
		ferrs := fast.decodeFast(root)
		gen := &TenantSet{File: "t.yaml"}
		gerrs := gen.decodeGeneral([]byte(doc))
		if len(ferrs) == 0 && len(gerrs) == 0 && !reflect.DeepEqual(fast.Tenants, gen.Tenants) {
			t.Fatalf("%q:\nfast %+v\ngeneral %+v", doc, fast.Tenants, gen.Tenants)
		}
		if (len(ferrs) == 0) != (len(gerrs) == 0) {
			t.Fatalf("%q:\nfast errors %v\ngeneral errors %v", doc, ferrs, gerrs)
		}
	})
}
