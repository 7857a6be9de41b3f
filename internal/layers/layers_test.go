package layers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// module is the module path; package paths in rules and graphs are relative to it.
const module = "github.com/sluice-proxy/sluice"

// A rule forbids every package matched by from, less those matched by
// except, to import a package matched by deny. Patterns are module-relative
// and read like `go list` patterns: "proxy" is that package only,
// "proxy/..." is proxy and every package below it, "..." is every package.
// A pattern that matches no package today (proxy/listen, internal/node)
// simply has nothing to check until the package appears.
//
// Test files (in-package and external) are held to the same directions as
// the code they test: a routing test that imported proxy would make routing
// untestable without proxy, and the in-package variant would be an import
// cycle the day proxy is imported the other way. Tests are freer in one way
// only: they may import the test helpers (internal/redistest, which imports
// package testing) that production code must not; rules marked prodOnly say
// so.
type rule struct {
	name     string
	why      string
	from     []string
	except   []string
	deny     []string
	prodOnly bool
}

// rules is the one table of import directions (DESIGN.md "Packages",
// STYLE.md "Packages", docs/ARCHITECTURE.md).
var rules = []rule{
	{
		name: "routing",
		why:  "routing imports neither proxy nor limiter nor the wiring above it",
		from: []string{"routing/..."},
		deny: []string{"proxy/...", "limiter/...", "configs/...", "cmd/...", "internal/node/..."},
	},
	{
		name: "limiter",
		why:  "limiter imports neither proxy nor routing nor the wiring above it",
		from: []string{"limiter/..."},
		deny: []string{"proxy/...", "routing/...", "configs/...", "cmd/...", "internal/node/..."},
	},
	{
		name: "certs",
		why:  "tls/certs is a leaf: no pipeline, limits, routing or config schema",
		from: []string{"tls/..."},
		deny: []string{"proxy/...", "limiter/...", "routing/...", "configs/...", "cmd/...", "internal/node/..."},
	},
	{
		name: "proxy",
		why:  "proxy and its sub-packages are configured by values, not by the config schema or the wiring",
		from: []string{"proxy/..."},
		deny: []string{"configs/...", "cmd/...", "internal/node/..."},
	},
	{
		name: "configs",
		why:  "configs sits below cmd and the lifecycle package that use it",
		from: []string{"configs/..."},
		deny: []string{"cmd/...", "internal/node/..."},
	},
	{
		name: "cmd-top",
		why:  "nothing imports cmd/...: commands are the top of the graph",
		from: []string{"..."},
		deny: []string{"cmd/..."},
	},
	{
		name:   "configs-users",
		why:    "only cmd/..., internal/node and deploy's manifest checks import configs",
		from:   []string{"..."},
		except: []string{"cmd/...", "internal/node/...", "configs/...", "deploy/..."},
		deny:   []string{"configs/..."},
	},
	{
		name: "proxy-leaves",
		why:  "proxy/listen and proxy/observe sit below proxy and proxy/ws (proxy/ws may import proxy)",
		from: []string{"proxy/listen/...", "proxy/observe/..."},
		deny: []string{"proxy", "proxy/ws/..."},
	},
	{
		name: "bridge-above",
		why:  "proxy/bridge sits above the pipeline: proxy/listen, proxy/observe and proxy/ws do not import it",
		from: []string{"proxy/listen/...", "proxy/observe/...", "proxy/ws/..."},
		deny: []string{"proxy/bridge/..."},
	},
	{
		name: "bridge-above-pipeline",
		why: "proxy/bridge wraps proxy.Handler: proxy does not import it (its external tests may, to serve the bridge; " +
			"its in-package tests cannot, that would be a cycle)",
		from:     []string{"proxy"},
		deny:     []string{"proxy/bridge/..."},
		prodOnly: true,
	},
	{
		name:     "test-helpers",
		why:      "internal/redistest imports package testing: test files only",
		from:     []string{"..."},
		except:   []string{"internal/redistest/..."},
		deny:     []string{"internal/redistest/..."},
		prodOnly: true,
	},
}

// pkg is one package of the graph, with in-module imports only.
type pkg struct {
	path        string   // module-relative
	imports     []string // of the package's own files
	testImports []string // of its _test.go files, in-package and external, less itself
}

// violation is one import that breaks one rule.
type violation struct {
	rule, from, to string
	test           bool
}

// String reads "routing -> proxy [routing]", with "(test)" for test imports.
func (v violation) String() string {
	arrow := "->"
	if v.test {
		arrow = "-(test)->"
	}
	return fmt.Sprintf("%s %s %s [%s]", v.from, arrow, v.to, v.rule)
}

// match reports whether a module-relative path matches a pattern.
func match(pattern, path string) bool {
	if pattern == "..." {
		return true
	}
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/")
	}
	return path == pattern
}

// matchAny reports whether path matches one of patterns.
func matchAny(patterns []string, path string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return match(p, path) })
}

// applies reports whether r governs imports made by path.
func (r rule) applies(path string) bool {
	return matchAny(r.from, path) && !matchAny(r.except, path)
}

// check returns every import in pkgs that breaks one of rules.
func check(pkgs []pkg, rules []rule) []violation {
	var out []violation
	for _, p := range pkgs {
		for _, r := range rules {
			if !r.applies(p.path) {
				continue
			}
			out = append(out, denied(r, p.path, p.imports, false)...)
			if !r.prodOnly {
				out = append(out, denied(r, p.path, p.testImports, true)...)
			}
		}
	}
	return out
}

// denied returns the imports of from that r forbids.
func denied(r rule, from string, imports []string, test bool) []violation {
	var out []violation
	for _, to := range imports {
		if to != from && matchAny(r.deny, to) {
			out = append(out, violation{rule: r.name, from: from, to: to, test: test})
		}
	}
	return out
}

func TestCheckSynthetic(t *testing.T) {
	type imp = []string
	cases := []struct {
		name string
		pkgs []pkg
		want []string
	}{
		{"today's shape", todaysShape(), nil},
		{"routing imports proxy", []pkg{{path: "routing", imports: imp{"proxy"}}},
			[]string{"routing -> proxy [routing]"}},
		{"routing imports a proxy sub-package", []pkg{{path: "routing", imports: imp{"proxy/listen"}}},
			[]string{"routing -> proxy/listen [routing]"}},
		{"a routing test imports limiter", []pkg{{path: "routing", testImports: imp{"limiter"}}},
			[]string{"routing -(test)-> limiter [routing]"}},
		{"limiter imports routing", []pkg{{path: "limiter", imports: imp{"routing"}}},
			[]string{"limiter -> routing [limiter]"}},
		{"limiter imports internal/node", []pkg{{path: "limiter", imports: imp{"internal/node"}}},
			[]string{"limiter -> internal/node [limiter]"}},
		{"tls/certs imports configs", []pkg{{path: "tls/certs", imports: imp{"configs"}}},
			[]string{"tls/certs -> configs [certs]", "tls/certs -> configs [configs-users]"}},
		{"tls/certs imports limiter", []pkg{{path: "tls/certs", imports: imp{"limiter"}}},
			[]string{"tls/certs -> limiter [certs]"}},
		{"proxy/ws imports configs", []pkg{{path: "proxy/ws", imports: imp{"configs"}}},
			[]string{"proxy/ws -> configs [configs-users]", "proxy/ws -> configs [proxy]"}},
		{"configs imports internal/node", []pkg{{path: "configs", imports: imp{"internal/node"}}},
			[]string{"configs -> internal/node [configs]"}},
		{"internal/node imports cmd/sluice", []pkg{{path: "internal/node", imports: imp{"cmd/sluice", "configs"}}},
			[]string{"internal/node -> cmd/sluice [cmd-top]"}},
		{"internal/benchsuite imports configs", []pkg{{path: "internal/benchsuite", testImports: imp{"configs"}}},
			[]string{"internal/benchsuite -(test)-> configs [configs-users]"}},
		{"cmd imports configs, internal/node and itself", []pkg{
			{path: "cmd/sluice", imports: imp{"configs", "internal/node"}, testImports: imp{"cmd/sluice"}}}, nil},
		{"proxy/listen imports proxy", []pkg{{path: "proxy/listen", imports: imp{"proxy", "routing"}}},
			[]string{"proxy/listen -> proxy [proxy-leaves]"}},
		{"proxy/observe imports proxy/ws", []pkg{{path: "proxy/observe", imports: imp{"proxy/ws"}}},
			[]string{"proxy/observe -> proxy/ws [proxy-leaves]"}},
		{"proxy/ws imports proxy, proxy/listen imports proxy/observe", []pkg{
			{path: "proxy/ws", imports: imp{"proxy", "proxy/listen"}},
			{path: "proxy/listen", imports: imp{"proxy/observe"}, testImports: imp{"proxy/listen"}}}, nil},
		{"proxy imports redistest", []pkg{{path: "proxy", imports: imp{"internal/redistest"}}},
			[]string{"proxy -> internal/redistest [test-helpers]"}},
		{"a proxy test imports redistest", []pkg{{path: "proxy", testImports: imp{"internal/redistest"}}}, nil},
		{"proxy imports proxy/bridge", []pkg{{path: "proxy", imports: imp{"proxy/bridge"}}},
			[]string{"proxy -> proxy/bridge [bridge-above-pipeline]"}},
		{"a proxy test serves proxy/bridge", []pkg{{path: "proxy", testImports: imp{"proxy/bridge"}}}, nil},
		{"proxy/ws imports proxy/bridge", []pkg{{path: "proxy/ws", imports: imp{"proxy/bridge"}}},
			[]string{"proxy/ws -> proxy/bridge [bridge-above]"}},
		{"a proxy/listen test imports proxy/bridge", []pkg{{path: "proxy/listen", testImports: imp{"proxy/bridge"}}},
			[]string{"proxy/listen -(test)-> proxy/bridge [bridge-above]"}},
		{"proxy/bridge imports the pipeline and its sub-packages", []pkg{{path: "proxy/bridge",
			imports: imp{"proxy", "proxy/listen", "proxy/observe", "proxy/ws"}}}, nil},
		{"prefixes stop at a path element", []pkg{{path: "routingx", imports: imp{"proxy", "limiter"}}}, nil},
	}
	hit := map[string]bool{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []string
			for _, v := range check(c.pkgs, rules) {
				got = append(got, v.String())
				hit[v.rule] = true
			}
			slices.Sort(got)
			if !slices.Equal(got, c.want) {
				t.Errorf("got %q; want %q", got, c.want)
			}
		})
	}
	for _, r := range rules {
		if !hit[r.name] {
			t.Errorf("rule %q is broken by no synthetic case: add one", r.name)
		}
	}
}

// TestRulePatterns catches a mistyped pattern, which would match nothing
// and so check nothing: each is "...", or a module-relative path with an
// optional "/..." suffix.
func TestRulePatterns(t *testing.T) {
	for _, r := range rules {
		if r.why == "" || len(r.from) == 0 || len(r.deny) == 0 {
			t.Errorf("rule %q: want a reason, from and deny patterns", r.name)
		}
		for _, p := range slices.Concat(r.from, r.except, r.deny) {
			if !wellFormed(p) {
				t.Errorf("rule %q: pattern %q; want \"...\" or a module-relative path, optionally ending in \"/...\"", r.name, p)
			}
		}
	}
	for _, p := range []string{"proxy/..", "/proxy", "proxy/", module + "/proxy", "proxy/.../x", ""} {
		if wellFormed(p) {
			t.Errorf("wellFormed(%q) = true; want false", p)
		}
	}
}

// wellFormed reports whether p is a pattern match understands.
func wellFormed(p string) bool {
	if p == "..." {
		return true
	}
	base, _ := strings.CutSuffix(p, "/...")
	if base == "" || strings.HasPrefix(base, module) {
		return false
	}
	for elem := range strings.SplitSeq(base, "/") {
		if elem == "" || strings.Contains(elem, ".") {
			return false
		}
	}
	return true
}

// todaysShape is the module's in-module import graph as of this test's
// writing, test imports included.
func todaysShape() []pkg {
	return []pkg{
		{path: "cmd/sluice", imports: []string{"configs", "internal/diagnose", "internal/gpusim", "internal/loadgen",
			"limiter", "proxy", "routing", "tls/certs"}, testImports: []string{"configs", "limiter", "proxy", "tls/certs"}},
		{path: "configs", imports: []string{"internal/gpusim", "limiter", "proxy", "routing", "tls/certs"},
			testImports: []string{"routing"}},
		{path: "internal/benchsuite", imports: []string{"internal/loadgen"}},
		{path: "internal/benchsuite/cmd/benchreport", imports: []string{"internal/benchsuite"}},
		{path: "internal/diagnose", imports: []string{"proxy"}, testImports: []string{"proxy"}},
		{path: "internal/loadgen", testImports: []string{"internal/gpusim"}},
		{path: "limiter", testImports: []string{"internal/redistest"}},
		{path: "proxy", imports: []string{"internal/units", "limiter", "routing"},
			testImports: []string{"internal/gpusim", "internal/loadgen", "internal/redistest", "limiter", "routing", "tls/certs"}},
		{path: "routing", testImports: []string{"internal/gpusim"}},
		{path: "tls"},
		{path: "tls/certs"},
	}
}

func TestImportDirections(t *testing.T) {
	pkgs := loadGraph(t)
	for _, must := range []string{"cmd/sluice", "configs", "proxy", "limiter", "routing", "tls/certs"} {
		if !slices.ContainsFunc(pkgs, func(p pkg) bool { return p.path == must }) {
			t.Fatalf("go list did not report package %q; the graph is incomplete", must)
		}
	}
	for _, v := range check(pkgs, rules) {
		t.Errorf("%v: %s", v, ruleWhy(v.rule))
	}
}

// ruleWhy returns the reason of the rule called name.
func ruleWhy(name string) string {
	i := slices.IndexFunc(rules, func(r rule) bool { return r.name == name })
	return rules[i].why
}

// listed is the part of `go list -json` output the test reads.
type listed struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// loadGraph lists the module's packages with one `go list` call.
func loadGraph(t *testing.T) []pkg {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), goTool(t), "list",
		"-json=ImportPath,Imports,TestImports,XTestImports", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	pkgs, err := parseList(out)
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

// goTool returns the go command: the one on PATH (go test puts its own
// GOROOT/bin first), else the one of the running toolchain.
func goTool(t *testing.T) string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	p := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("no go command: %v", err)
	}
	return p
}

// moduleRoot walks up from the working directory to the directory holding go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding module root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("finding module root: no go.mod above the working directory")
		}
		dir = parent
	}
}

// parseList decodes the stream of JSON objects `go list -json` prints and
// keeps in-module imports only, module-relative.
func parseList(out []byte) ([]pkg, error) {
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var l listed
		err := dec.Decode(&l)
		if errors.Is(err, io.EOF) {
			return pkgs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("decoding go list output: %w", err)
		}
		p := pkg{path: rel(l.ImportPath), imports: inModule(l.Imports)}
		for _, to := range inModule(slices.Concat(l.TestImports, l.XTestImports)) {
			if to != p.path && !slices.Contains(p.testImports, to) {
				p.testImports = append(p.testImports, to)
			}
		}
		pkgs = append(pkgs, p)
	}
}

// inModule returns the module-relative paths of the in-module imports.
func inModule(imports []string) []string {
	var out []string
	for _, imp := range imports {
		if imp == module || strings.HasPrefix(imp, module+"/") {
			out = append(out, rel(imp))
		}
	}
	return out
}

// rel strips the module path; the module root package becomes ".".
func rel(path string) string {
	if path == module {
		return "."
	}
	return strings.TrimPrefix(path, module+"/")
}
