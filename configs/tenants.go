package configs

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"

	"github.com/goccy/go-yaml/ast"

	"github.com/sluice-proxy/sluice/proxy"
)

// TenantSet is a tenants file: a YAML list of tenants with the same entries
// as the config's tenants list (or a mapping whose only key is "tenants").
// It is immutable once loaded.
type TenantSet struct {
	// File is the path the tenants were read from.
	File string
	// Version identifies the file's content (see Version).
	Version string
	// Raw is the file's text.
	Raw []byte
	// Tenants are the file's tenants, in file order.
	Tenants []proxy.TenantConfig

	pos func(path string) Pos // path below the list: "[3].keys[0]"
}

// Pos returns the position of a path such as "tenants[3].keys[0]", or of its
// closest ancestor written in the file.
func (s *TenantSet) Pos(path string) Pos {
	if s.pos == nil {
		return Pos{Line: 1, Col: 1}
	}
	return s.pos(path)
}

// Version is the short content hash that identifies a config or tenants
// file's version: the first 12 hex digits of the SHA-256 of its bytes.
func Version(data []byte) string {
	h := sha256.Sum256(data)
	return hex.EncodeToString(h[:6])
}

// LoadTenants reads, decodes and validates a tenants file on its own. Every
// problem is an *Error naming the tenants file. Checks that involve the main
// config (a tenant id or key in both places) are made by Config.WithTenants.
func LoadTenants(path string) (*TenantSet, error) {
	data, err := ReadFile(path)
	if err != nil {
		return nil, &Error{File: path, Msg: fmt.Sprintf("reading tenants file: %v", err)}
	}
	return ParseTenants(path, data)
}

// ParseTenants decodes and validates tenants file text; name is used in
// errors. Block-style YAML is read by a fast scanner (100,000 tenants load
// in a fraction of a second); other YAML falls back to the general parser.
func ParseTenants(name string, data []byte) (*TenantSet, error) {
	s := &TenantSet{File: name, Version: Version(data), Raw: data}
	var errs []error
	root, err := fastParse(name, data)
	switch {
	case err == nil:
		errs = s.decodeFast(root)
	case errors.Is(err, errUnsupported):
		errs = s.decodeGeneral(data)
	default:
		errs = []error{err}
	}
	if len(errs) == 0 {
		errs = validateTenants(tenantSource{file: name, tenants: s.Tenants, pos: s.Pos})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return s, nil
}

const tenantsPath = "tenants"

// decodeFast decodes the light tree of a tenants file: the document is the
// list, or a mapping whose only key "tenants" holds it.
func (s *TenantSet) decodeFast(root *fnode) []error {
	d := &fdecoder{file: s.File}
	list := root
	if root.kind == fMap {
		list = nil
		for _, e := range root.entries {
			if e.key != tenantsPath {
				d.errorf(e.keyPos, "unknown key %q in tenants file (it holds a list of tenants, or \"tenants:\" and the list)", e.key)
				continue
			}
			list = e.val
		}
	}
	t := &posTable{list: root.pos}
	if list != nil && list.kind != fNull {
		var out []proxy.TenantConfig
		d.decode(list, reflect.ValueOf(&out).Elem(), fseg{key: tenantsPath})
		s.Tenants = out
		t.fromTree(list)
	}
	s.pos = t.lookup
	return d.errs
}

// decodeGeneral reads the file with goccy's parser and the general decoder.
func (s *TenantSet) decodeGeneral(data []byte) []error {
	d := newDecoder(s.File)
	var doc struct {
		Tenants []proxy.TenantConfig `yaml:"tenants"`
	}
	if f := d.parseFile(data); f != nil {
		switch body := d.resolve(f.Docs[0].Body); body.(type) {
		case *ast.SequenceNode:
			d.decode(body, reflect.ValueOf(&doc.Tenants).Elem(), tenantsPath)
		case *ast.MappingNode, *ast.MappingValueNode:
			d.decode(body, reflect.ValueOf(&doc).Elem(), "")
		case nil, *ast.NullNode:
		default:
			d.errorf(nodePos(body), "a tenants file holds a list of tenants, or \"tenants:\" and the list")
		}
	}
	s.Tenants = doc.Tenants
	t := &posTable{list: Pos{Line: 1, Col: 1}}
	t.fromPaths(len(doc.Tenants), d.pos)
	s.pos = t.lookup
	return d.errs
}

// posTable holds the positions validation reports for a tenants file,
// compactly, so that a loaded file does not keep its syntax tree.
type posTable struct {
	list  Pos
	items []tenantPos
	keys  []Pos // every tenant's keys; tenantPos.keys indexes here
}

type tenantPos struct {
	item, id, limits Pos
	keys, nkeys      int
}

func (t *posTable) fromTree(list *fnode) {
	t.list = list.pos
	if list.kind != fSeq {
		return
	}
	t.items = make([]tenantPos, len(list.items))
	t.keys = make([]Pos, 0, len(list.items))
	for i, item := range list.items {
		tp := tenantPos{item: item.pos, keys: len(t.keys)}
		for _, e := range item.entries {
			switch e.key {
			case "id":
				tp.id = e.val.pos
			case "limits":
				tp.limits = e.val.pos
			case "keys":
				for _, k := range e.val.items {
					t.keys = append(t.keys, k.pos)
				}
			}
		}
		tp.nkeys = len(t.keys) - tp.keys
		t.items[i] = tp
	}
}

func (t *posTable) fromPaths(n int, pos map[string]Pos) {
	t.items = make([]tenantPos, n)
	if p, ok := pos[tenantsPath]; ok {
		t.list = p
	}
	for i := range t.items {
		base := fmt.Sprintf("%s[%d]", tenantsPath, i)
		tp := tenantPos{item: pos[base], id: pos[base+".id"], limits: pos[base+".limits"], keys: len(t.keys)}
		for j := 0; ; j++ {
			p, ok := pos[fmt.Sprintf("%s.keys[%d]", base, j)]
			if !ok {
				break
			}
			t.keys = append(t.keys, p)
		}
		tp.nkeys = len(t.keys) - tp.keys
		t.items[i] = tp
	}
}

// lookup returns the position of "tenants[i]", "tenants[i].id",
// "tenants[i].keys[j]" or "tenants[i].limits…", else of the closest entry.
func (t *posTable) lookup(path string) Pos {
	rest, ok := strings.CutPrefix(path, tenantsPath+"[")
	end := strings.IndexByte(rest, ']')
	if !ok || end < 0 {
		return t.list
	}
	i, err := strconv.Atoi(rest[:end])
	if err != nil || i < 0 || i >= len(t.items) {
		return t.list
	}
	tp, rest := t.items[i], rest[end+1:]
	var p Pos
	switch {
	case strings.HasPrefix(rest, ".id"):
		p = tp.id
	case strings.HasPrefix(rest, ".limits"):
		p = tp.limits
	case strings.HasPrefix(rest, ".keys["):
		j, err := strconv.Atoi(strings.TrimSuffix(rest[len(".keys["):], "]"))
		if err == nil && j >= 0 && j < tp.nkeys {
			p = t.keys[tp.keys+j]
		}
	}
	if p.Line == 0 {
		p = tp.item
	}
	if p.Line == 0 {
		p = t.list
	}
	return p
}

// parentPath drops a path's last element: "a[1].b" → "a[1]" → "a".
func parentPath(path string) string {
	for i := len(path) - 1; i >= 0; i-- {
		if path[i] == '.' || path[i] == '[' {
			return path[:i]
		}
	}
	return ""
}

// WithTenants returns a copy of c serving the tenants of s in place of its
// tenants file's, after checking them against c's own tenants (an id or key
// hash may not be in both places). c is not changed.
func (c *Config) WithTenants(s *TenantSet) (*Config, error) {
	if errs := crossCheckTenants(c.inlineTenants(), s.source()); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	cp := *c
	cp.FileTenants = s
	return &cp, nil
}

// AllTenants returns the config's tenants followed by its tenants file's.
func (c *Config) AllTenants() []proxy.TenantConfig {
	if c.FileTenants == nil {
		return c.Tenants
	}
	all := make([]proxy.TenantConfig, 0, len(c.Tenants)+len(c.FileTenants.Tenants))
	return append(append(all, c.Tenants...), c.FileTenants.Tenants...)
}

// TenantsPath is where the tenants file lives: tenants_file resolved
// against the config file's directory. Empty without one.
func (c *Config) TenantsPath() string {
	if c.TenantsFile == "" {
		return ""
	}
	if filepath.IsAbs(c.TenantsFile) || c.File == DefaultName {
		return c.TenantsFile
	}
	return filepath.Join(filepath.Dir(c.File), c.TenantsFile)
}

func (c *Config) inlineTenants() tenantSource {
	return tenantSource{file: c.File, tenants: c.Tenants, pos: c.Pos}
}

func (s *TenantSet) source() tenantSource {
	return tenantSource{file: s.File, tenants: s.Tenants, pos: s.Pos}
}

// crossCheckTenants reports the tenants of file whose id or key hash is
// also in inline; each list must have been validated on its own. It costs
// one lookup per tenant and key of file.
func crossCheckTenants(inline, file tenantSource) []error {
	ids := make(map[string]bool, len(inline.tenants))
	keys := make(map[string]string, len(inline.tenants))
	for _, t := range inline.tenants {
		ids[t.ID] = true
		for _, k := range t.Keys {
			keys[k] = t.ID
		}
	}
	var errs []error
	for i, t := range file.tenants {
		if ids[t.ID] {
			path := fmt.Sprintf("%s[%d]", tenantsPath, i)
			errs = append(errs, &Error{File: file.file, Pos: file.pos(path + ".id"),
				Msg: fmt.Sprintf("%s: tenant id %q is also defined in %s (a tenant lives in one place)", path, t.ID, inline.file)})
		}
		for j, k := range t.Keys {
			if owner, dup := keys[k]; dup {
				errs = append(errs, &Error{File: file.file, Pos: file.pos(fmt.Sprintf("%s[%d].keys[%d]", tenantsPath, i, j)),
					Msg: fmt.Sprintf("tenant %q: key hash already belongs to tenant %q in %s", t.ID, owner, inline.file)})
			}
		}
	}
	return errs
}

// tenantSource is a list of tenants and where its entries are written.
type tenantSource struct {
	file    string
	tenants []proxy.TenantConfig
	pos     func(path string) Pos // "tenants[3].keys[0]"
}

// validateTenants checks tenant lists together: ids and key hashes unique
// across all of them, keys in hash form, limits valid. Paths are formatted
// only for errors, so 100,000 valid tenants cost little.
func validateTenants(srcs ...tenantSource) []error {
	var errs []error
	n := 0
	for _, s := range srcs {
		n += len(s.tenants)
	}
	type owner struct {
		id   string
		file string
	}
	ids := make(map[string]string, n) // id -> file
	keys := make(map[string]owner, n)
	for _, s := range srcs {
		errorf := func(path, format string, args ...any) {
			errs = append(errs, &Error{File: s.file, Pos: s.pos(path), Msg: fmt.Sprintf(format, args...)})
		}
		for i := range s.tenants {
			t := &s.tenants[i]
			tp := func() string { return fmt.Sprintf("%s[%d]", tenantsPath, i) }
			switch file, dup := ids[t.ID]; {
			case t.ID == "":
				errorf(tp(), "%s: id is required", tp())
			case dup && file == s.file:
				errorf(tp()+".id", "%s: duplicate tenant id %q", tp(), t.ID)
			case dup:
				errorf(tp()+".id", "%s: tenant id %q is also defined in %s (a tenant lives in one place)", tp(), t.ID, file)
			}
			ids[t.ID] = s.file
			if len(t.Keys) == 0 {
				errorf(tp(), "tenant %q: at least one key hash is required (see sluice hash-key)", t.ID)
			}
			for j, k := range t.Keys {
				kp := func() string { return fmt.Sprintf("%s.keys[%d]", tp(), j) }
				if !validKeyHash(k) {
					errorf(kp(), "tenant %q: key must be a hash printed by \"sluice hash-key\" (sha256:<64 hex digits>), never the key itself", t.ID)
				} else if o, dup := keys[k]; dup {
					errorf(kp(), "tenant %q: key hash already belongs to tenant %q%s", t.ID, o.id, elsewhere(o.file, s.file))
				}
				keys[k] = owner{t.ID, s.file}
			}
			if err := t.Limits.Validate(); err != nil {
				for _, e := range unjoin(err) {
					errorf(tp()+".limits", "%s.limits: %v", tp(), e)
				}
			}
		}
	}
	return errs
}

func elsewhere(file, here string) string {
	if file == here {
		return ""
	}
	return " in " + file
}
