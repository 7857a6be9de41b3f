package configs

import (
	"fmt"
	"io"
	"reflect"
	"slices"
	"sort"
	"strings"

	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/routing"
)

// Diff is what changing from one config to another does, in operator
// terms: routes, pools and backends, tenants and keys, limits raised or
// lowered, other settings, and the keys a running node cannot change.
type Diff struct {
	// From and To are the versions compared.
	From, To string
	// Sections lists the changes by area, in a fixed order; areas without
	// changes are left out.
	Sections []DiffSection
	// RestartRequired names the changed keys a running node cannot apply
	// ("listeners.http", "redis.addrs"): a reload that changes one of them
	// is refused, and the node keeps its old config until restarted.
	RestartRequired []string
}

// DiffSection is the changes in one area of the config.
type DiffSection struct {
	// Name is the area: "routes", "pools", "tenants", "limits", "proxy",
	// "node", "simulators" or "restart required".
	Name string
	// Lines describe one change each.
	Lines []string
}

// Empty reports whether the configs are the same in effect.
func (d *Diff) Empty() bool { return len(d.Sections) == 0 }

// Lines returns every change as "section: line".
func (d *Diff) Lines() []string {
	var out []string
	for _, s := range d.Sections {
		for _, l := range s.Lines {
			out = append(out, s.Name+": "+l)
		}
	}
	return out
}

// Write prints the diff for people; the output is deterministic.
func (d *Diff) Write(w io.Writer) {
	if d.Empty() {
		fmt.Fprintf(w, "no changes (%s → %s)\n", d.From, d.To)
		return
	}
	fmt.Fprintf(w, "changes %s → %s:\n", d.From, d.To)
	for _, s := range d.Sections {
		fmt.Fprintf(w, "%s:\n", s.Name)
		for _, l := range s.Lines {
			fmt.Fprintf(w, "  %s\n", l)
		}
	}
}

// Compare describes the change from old to new. Both must be loaded
// (defaults applied) configs.
func Compare(from, to *Config) *Diff {
	old, new := from, to
	d := &Diff{From: versionOf(old), To: versionOf(new)}
	add := func(name string, lines []string) {
		if len(lines) > 0 {
			d.Sections = append(d.Sections, DiffSection{Name: name, Lines: lines})
		}
	}
	add("routes", diffRoutes(old.Routes, new.Routes))
	add("pools", diffPools(old.Pools, new.Pools))
	tenants, limits := diffTenants(old, new)
	add("tenants", tenants)
	add("limits", limits)
	restart := RestartRequired(old, new)
	add("proxy", fieldLines(withoutRestart("proxy", diffFields("", old.Proxy, new.Proxy), restart)))
	add("node", fieldLines(withoutRestart("node", diffFields("", old.Node, new.Node), restart)))
	add("simulators", diffSimulators(old.Simulators, new.Simulators))
	var lines []string
	for _, c := range restart {
		d.RestartRequired = append(d.RestartRequired, c.Path)
		lines = append(lines, c.String())
	}
	add("restart required", lines)
	return d
}

func versionOf(c *Config) string {
	v := c.Version
	if c.FileTenants != nil {
		v += "+tenants " + c.FileTenants.Version
	}
	return v
}

// withoutRestart drops the changes of section that are listed under
// restart required.
func withoutRestart(section string, cs, restart []FieldChange) []FieldChange {
	out := cs[:0]
	for _, c := range cs {
		dup := false
		for _, r := range restart {
			dup = dup || r.Path == section+"."+c.Path
		}
		if !dup {
			out = append(out, c)
		}
	}
	return out
}

// FieldChange is one changed setting: its key path and old and new values
// as text (secrets are shown as "(hidden)").
type FieldChange struct {
	Path     string
	Old, New string

	old, new reflect.Value
}

func (c FieldChange) String() string {
	if c.Old == hidden {
		return c.Path + " (changed)"
	}
	return c.Path + " " + c.Old + " → " + c.New
}

const hidden = "(hidden)"

// secretPath reports whether a changed setting is a secret, never
// printed: a secret key (isSecretKey: password, api_key, token, secret,
// *_password, *_api_key, *_secret) or anything under one (every tracing.headers value).
func secretPath(path string) bool {
	for seg := range strings.SplitSeq(path, ".") {
		if i := strings.IndexByte(seg, '['); i >= 0 {
			seg = seg[:i]
		}
		if isSecretKey(seg) {
			return true
		}
	}
	return false
}

// RestartRequired lists the changed settings a running node cannot apply:
// node name, region and access_log, listener addresses and TLS listener settings, the
// redis section, the proxy's dial_timeout and tenant_metric_labels
// (fixed in the node's transport and metrics at start), and the tracing
// section (the exporter is made once, at start).
func RestartRequired(old, new *Config) []FieldChange {
	var out []FieldChange
	out = append(out, diffFields("node.name", old.Node.Name, new.Node.Name)...)
	out = append(out, diffFields("node.region", old.Node.Region, new.Node.Region)...)
	out = append(out, diffFields("node.access_log", old.Node.AccessLog, new.Node.AccessLog)...) // set on the log at start
	out = append(out, diffFields("listeners", old.Listeners, new.Listeners)...)
	out = append(out, diffFields("redis", old.Redis, new.Redis)...)
	out = append(out, diffFields("region", old.Region, new.Region)...) // the rebalancer is made once, at start
	out = append(out, diffFields("proxy.dial_timeout", old.Proxy.DialTimeout, new.Proxy.DialTimeout)...)
	out = append(out, diffFields("proxy.tenant_metric_labels", old.Proxy.TenantMetricLabels, new.Proxy.TenantMetricLabels)...)
	out = append(out, diffFields("tracing", old.Tracing, new.Tracing)...) // the exporter is made once, at start
	return out
}

// diffFields compares two values of the same type leaf by leaf, naming
// leaves by their YAML keys below path. Lists are compared whole.
func diffFields(path string, a, b any) []FieldChange {
	var out []FieldChange
	diffValue(path, reflect.ValueOf(a), reflect.ValueOf(b), &out)
	return out
}

func diffValue(path string, a, b reflect.Value, out *[]FieldChange) {
	switch {
	case a.Kind() == reflect.Pointer && (a.IsNil() || b.IsNil()):
		if a.IsNil() != b.IsNil() && !defaultTrue(a, b) {
			*out = append(*out, change(path, a, b))
		}
		return
	case a.Kind() == reflect.String && (redacted(a.String()) || redacted(b.String())):
		return // a secret the node did not show: unknown, not changed
	case a.Kind() == reflect.String && a.String() != b.String() && RedactURL(a.String()) == RedactURL(b.String()) &&
		(RedactURL(a.String()) == a.String() || RedactURL(b.String()) == b.String()):
		return // a URL whose user info the node did not show: unknown, not changed
	case a.Kind() == reflect.Pointer:
		diffValue(path, a.Elem(), b.Elem(), out)
		return
	case a.Kind() == reflect.Struct && !isScalarType(a.Type()):
		keys := fieldIndex(a.Type())
		names := make([]string, 0, len(keys))
		for k := range keys {
			names = append(names, k)
		}
		sort.Slice(names, func(i, j int) bool { return slices.Compare(keys[names[i]], keys[names[j]]) < 0 })
		for _, k := range names {
			diffValue(join(path, k), a.FieldByIndex(keys[k]), b.FieldByIndex(keys[k]), out)
		}
		return
	case a.Kind() == reflect.Map:
		for _, k := range mapKeys(a, b) {
			kv := reflect.ValueOf(k).Convert(a.Type().Key())
			av, bv := a.MapIndex(kv), b.MapIndex(kv)
			if !av.IsValid() || !bv.IsValid() {
				*out = append(*out, change(join(path, k), av, bv))
				continue
			}
			diffValue(join(path, k), av, bv, out)
		}
		return
	}
	if !reflect.DeepEqual(a.Interface(), b.Interface()) {
		*out = append(*out, change(path, a, b))
	}
}

// defaultTrue reports whether a nil and a non-nil *bool mean the same:
// every optional bool in the config (enforce, enforce_limits) defaults to
// true.
func defaultTrue(a, b reflect.Value) bool {
	if a.Type().Elem().Kind() != reflect.Bool {
		return false
	}
	if a.IsNil() {
		a = b
	}
	return a.Elem().Bool()
}

func mapKeys(a, b reflect.Value) []string {
	seen := map[string]bool{}
	for _, m := range []reflect.Value{a, b} {
		for _, k := range m.MapKeys() {
			seen[k.String()] = true
		}
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func change(path string, a, b reflect.Value) FieldChange {
	c := FieldChange{Path: path, Old: show(a), New: show(b), old: a, new: b}
	if secretPath(path) {
		c.Old, c.New = hidden, hidden
	}
	if c.Old == c.New && c.Old != hidden {
		c.New += " (user info changed)" // URLs differing only in credentials
	}
	return c
}

// show formats a value for a diff line.
func show(v reflect.Value) string {
	if !v.IsValid() {
		return "(none)"
	}
	if v.Kind() == reflect.Pointer {
		switch {
		case !v.IsNil():
			v = v.Elem()
		case v.Type().Elem().Kind() == reflect.Struct:
			return "(none)"
		default:
			return "(default)"
		}
	}
	switch v.Kind() {
	case reflect.String:
		if v.String() == "" {
			return `""`
		}
		return RedactURL(v.String()) // URL user info is never printed
	case reflect.Slice:
		if v.Len() == 0 {
			return "[]"
		}
		parts := make([]string, v.Len())
		for i := range parts {
			parts[i] = show(v.Index(i))
		}
		return "[" + strings.Join(parts, " ") + "]"
	case reflect.Struct:
		if !isScalarType(v.Type()) {
			var fs []FieldChange
			diffValue("", reflect.Zero(v.Type()), v, &fs)
			return "{" + strings.Join(fieldTexts(fs), ", ") + "}"
		}
	}
	return fmt.Sprint(v.Interface())
}

func fieldTexts(fs []FieldChange) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.Path + ": " + f.New
	}
	return out
}

// fieldLines is one "~ key old → new" line per change.
func fieldLines(cs []FieldChange) []string {
	var out []string
	for _, c := range cs {
		out = append(out, "~ "+c.String())
	}
	return out
}

// joinChanges is "key old → new; key2 …" for one entry's changes.
func joinChanges(cs []FieldChange) string {
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = c.String()
	}
	return strings.Join(parts, "; ")
}

func diffRoutes(old, new []Route) []string {
	var out []string
	pairByKey(old, new, func(r Route) string { return r.Name }, func(name string, o, n *Route) {
		switch {
		case o == nil:
			out = append(out, fmt.Sprintf("+ added %q: %s", name, routeSummary(*n)))
		case n == nil:
			out = append(out, fmt.Sprintf("- removed %q: %s", name, routeSummary(*o)))
		default:
			if cs := diffFields("", *o, *n); len(cs) > 0 {
				out = append(out, fmt.Sprintf("~ changed %q: %s", name, joinChanges(cs)))
			}
		}
	})
	return out
}

func routeSummary(r Route) string {
	s := "path " + r.Path
	if r.Host != "" {
		s = "host " + r.Host + ", " + s
	}
	if len(r.Models) > 0 {
		s += ", models [" + strings.Join(r.Models, " ") + "]"
	}
	s += ", pool " + r.Pool
	if !r.LimitsEnforced() {
		s += ", limits in shadow mode"
	}
	return s
}

func diffPools(old, new []routing.PoolConfig) []string {
	var out []string
	pairByKey(old, new, func(p routing.PoolConfig) string { return p.Name }, func(name string, o, n *routing.PoolConfig) {
		switch {
		case o == nil:
			out = append(out, fmt.Sprintf("+ added %q: backends %s", name, backendURLs(n.Backends)))
		case n == nil:
			out = append(out, fmt.Sprintf("- removed %q: backends %s", name, backendURLs(o.Backends)))
		default:
			if parts := poolChanges(*o, *n); len(parts) > 0 {
				out = append(out, fmt.Sprintf("~ changed %q: %s", name, strings.Join(parts, "; ")))
			}
		}
	})
	return out
}

func backendURLs(bs []routing.BackendConfig) string {
	urls := make([]string, len(bs))
	for i, b := range bs {
		urls[i] = RedactURL(b.URL)
	}
	return "[" + strings.Join(urls, " ") + "]"
}

// poolChanges lists backends added, removed and changed (by URL), then the
// pool's other settings.
func poolChanges(o, n routing.PoolConfig) []string {
	var parts []string
	pairByKey(o.Backends, n.Backends, func(b routing.BackendConfig) string { return RedactURL(b.URL) }, func(u string, a, b *routing.BackendConfig) {
		switch {
		case a == nil:
			parts = append(parts, "backend added "+u)
		case b == nil:
			parts = append(parts, "backend removed "+u)
		default:
			for _, c := range diffFields("", *a, *b) {
				parts = append(parts, "backend "+u+" "+c.String())
			}
		}
	})
	o.Backends, n.Backends = nil, nil
	for _, c := range diffFields("", o, n) {
		parts = append(parts, c.String())
	}
	return parts
}

func diffSimulators(old, new []Simulator) []string {
	var out []string
	pairByKey(old, new, func(s Simulator) string { return s.Name }, func(name string, o, n *Simulator) {
		switch {
		case o == nil:
			out = append(out, fmt.Sprintf("+ added %q (model %s)", name, n.Model))
		case n == nil:
			out = append(out, fmt.Sprintf("- removed %q", name))
		default:
			if cs := diffFields("", *o, *n); len(cs) > 0 {
				out = append(out, fmt.Sprintf("~ changed %q (restarted on reload): %s", name, joinChanges(cs)))
			}
		}
	})
	return out
}

// diffTenants compares the tenants of both configs (inline and file) by
// id: tenants added and removed, key rotations (counted, hashes shortened)
// and, in limits, each limit field raised or lowered. Lines are sorted by
// tenant id. Equal tenants cost one map lookup and a comparison, so files
// of 100,000 tenants compare quickly.
func diffTenants(old, new *Config) (tenants, limits []string) {
	if o, n := old.TenantsFile, new.TenantsFile; o != n {
		tenants = append(tenants, fmt.Sprintf("~ tenants_file %s → %s", show(reflect.ValueOf(o)), show(reflect.ValueOf(n))))
	}
	type line struct{ id, text string }
	var tl, ll []line
	oldAll, newAll := old.AllTenants(), new.AllTenants()
	om := make(map[string]*proxy.TenantConfig, len(oldAll))
	for i := range oldAll {
		om[oldAll[i].ID] = &oldAll[i]
	}
	seen := make(map[string]bool, len(newAll))
	for i := range newAll {
		n := &newAll[i]
		seen[n.ID] = true
		o, ok := om[n.ID]
		switch {
		case !ok:
			tl = append(tl, line{n.ID, fmt.Sprintf("+ added %q (%s)", n.ID, plural(len(n.Keys), "key"))})
		case slices.Equal(o.Keys, n.Keys) && reflect.DeepEqual(o.Limits, n.Limits):
		default:
			if l := keyRotation(o.Keys, n.Keys); l != "" {
				tl = append(tl, line{n.ID, fmt.Sprintf("~ %q keys: %s", n.ID, l)})
			}
			for _, c := range diffFields("", o.Limits, n.Limits) {
				ll = append(ll, line{n.ID, fmt.Sprintf("~ %q %s", n.ID, limitChange(c))})
			}
		}
	}
	for i := range oldAll {
		if o := &oldAll[i]; !seen[o.ID] {
			tl = append(tl, line{o.ID, fmt.Sprintf("- removed %q (%s)", o.ID, plural(len(o.Keys), "key"))})
		}
	}
	byID := func(a, b line) int { return strings.Compare(a.id, b.id) }
	slices.SortStableFunc(tl, byID)
	slices.SortStableFunc(ll, byID)
	for _, l := range tl {
		tenants = append(tenants, l.text)
	}
	for _, l := range ll {
		limits = append(limits, l.text)
	}
	return tenants, limits
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// keyRotation says how many key hashes were added and removed, showing
// each shortened: "1 added (sha256:1c590839…), 1 removed (sha256:9f86d081…)".
func keyRotation(old, new []string) string {
	oset, nset := map[string]bool{}, map[string]bool{}
	for _, k := range old {
		oset[k] = true
	}
	for _, k := range new {
		nset[k] = true
	}
	var added, removed []string
	for _, k := range new {
		if !oset[k] {
			added = append(added, shortHash(k))
		}
	}
	for _, k := range old {
		if !nset[k] {
			removed = append(removed, shortHash(k))
		}
	}
	var parts []string
	if len(added) > 0 {
		parts = append(parts, fmt.Sprintf("%d added (%s)", len(added), strings.Join(added, ", ")))
	}
	if len(removed) > 0 {
		parts = append(parts, fmt.Sprintf("%d removed (%s)", len(removed), strings.Join(removed, ", ")))
	}
	return strings.Join(parts, ", ")
}

// shortHash shows enough of a key hash to recognise it, never all of it.
func shortHash(k string) string {
	if len(k) > len("sha256:")+8 {
		return k[:len("sha256:")+8] + "…"
	}
	return k
}

// unlimitedFields are the Limits keys where zero means "no limit".
var unlimitedFields = map[string]bool{
	"max_concurrency": true, "tokens_per_minute": true, "input_tokens_per_minute": true,
	"output_tokens_per_minute": true, "requests_per_minute": true,
}

// limitChange describes a changed limit: "tokens_per_minute 400000 →
// 200000 (lowered)". Zero is "unlimited" for the limits themselves,
// "default" for burst and default_max_tokens, and "inherited" inside a
// per-model override.
func limitChange(c FieldChange) string {
	field := c.Path[strings.LastIndexByte(c.Path, '.')+1:]
	inModel := strings.HasPrefix(c.Path, "models.") && strings.Count(c.Path, ".") >= 2
	if field == "enforce" {
		return c.Path + " " + enforceText(c.old) + " → " + enforceText(c.new) + enforceNote(c.new)
	}
	if !c.old.IsValid() || !c.new.IsValid() || !c.old.CanInt() {
		return c.String()
	}
	o, n := c.old.Int(), c.new.Int()
	zero := "default"
	switch {
	case inModel:
		zero = "inherited"
	case unlimitedFields[field]:
		zero = "unlimited"
	}
	text := func(v int64) string {
		if v == 0 {
			return zero
		}
		return fmt.Sprint(v)
	}
	s := c.Path + " " + text(o) + " → " + text(n)
	if !unlimitedFields[field] || inModel && (o == 0 || n == 0) {
		return s
	}
	switch {
	case o == 0 || (n != 0 && n < o):
		return s + " (lowered)"
	default:
		return s + " (raised)"
	}
}

func enforceText(v reflect.Value) string {
	if v.IsValid() && v.Kind() == reflect.Pointer && !v.IsNil() && !v.Elem().Bool() {
		return "false"
	}
	return "true"
}

func enforceNote(v reflect.Value) string {
	if enforceText(v) == "false" {
		return " (shadow mode: reported, not enforced)"
	}
	return " (enforced)"
}

// unionKeys returns the keys of both maps, sorted.
func unionKeys[V any](a, b map[string]V) []string {
	seen := make(map[string]bool, len(a)+len(b))
	for k := range a {
		seen[k] = true
	}
	for k := range b {
		seen[k] = true
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Redacted replaces secrets in the text a node shows of its config.
const Redacted = "<redacted>"

func redacted(s string) bool { return s == Redacted }

// pairByKey matches the entries of two lists by key and calls f for each
// key in sorted order with both sides; o is nil for an entry only in new, n
// for one only in old.
func pairByKey[T any](old, new []T, key func(T) string, f func(k string, o, n *T)) {
	om, nm := indexBy(old, key), indexBy(new, key)
	for _, k := range unionKeys(om, nm) {
		var o, n *T
		if v, ok := om[k]; ok {
			o = &v
		}
		if v, ok := nm[k]; ok {
			n = &v
		}
		f(k, o, n)
	}
}

// indexBy maps each element of xs by its key (the last one wins).
func indexBy[T any](xs []T, key func(T) string) map[string]T {
	m := make(map[string]T, len(xs))
	for _, x := range xs {
		m[key(x)] = x
	}
	return m
}
