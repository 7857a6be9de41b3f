package configs

import (
	"net/url"
	"strings"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
)

// secretKeyNames are the mapping keys whose values are secrets wherever
// they appear (redis.password, pools[].api_key, and the same names in any
// future section). Their values are shown as Redacted.
var secretKeyNames = map[string]bool{"password": true, "api_key": true, "token": true, "secret": true,
	// every value under a headers map (tracing.headers: a collector's
	// credentials) is a secret too
	"headers": true}

// RedactedText returns the config's text for showing the active config to
// operators (/debug/config?format=yaml): the parsed file written out
// again, with the value of every secret key (password, api_key, token,
// secret) replaced by Redacted whatever its YAML style (plain, quoted,
// multi-line, block literal or folded, flow), any other value equal to a
// secret redacted too (an alias or a copy of it), the user info of every
// URL removed, and no comments. Aliases are written out expanded. The
// result parses to the same config but for those values; Compare treats
// a Redacted value as unknown, not as a change.
func (c *Config) RedactedText() []byte { return RedactYAML(c.Raw) }

// RedactedText returns the tenants file's text as RedactedText does for a
// config: comments removed, secret keys and URL user info redacted.
func (s *TenantSet) RedactedText() []byte { return RedactYAML(s.Raw) }

// RedactYAML redacts a YAML document as RedactedText does. Text that does
// not parse (it never reaches here from a loaded config) is replaced
// whole by a comment saying so: it is never shown verbatim.
func RedactYAML(data []byte) []byte {
	f, err := parser.ParseBytes(data, 0)
	if err != nil || len(f.Docs) == 0 || f.Docs[0].Body == nil {
		if err != nil {
			return []byte("# the text could not be parsed; not shown\n")
		}
		return []byte{}
	}
	r := &redactor{anchors: map[string]ast.Node{}, secrets: map[string]bool{}}
	r.collect(f.Docs[0].Body, false, 0)
	v := r.value(f.Docs[0].Body, false, 0)
	out, err := yaml.MarshalWithOptions(v, yaml.UseLiteralStyleIfMultiline(true), yaml.IndentSequence(true))
	if err != nil {
		return []byte("# the text could not be written; not shown\n")
	}
	return out
}

// redactor turns a YAML syntax tree into plain values (yaml.MapSlice,
// []any, scalars) with secrets redacted.
type redactor struct {
	anchors map[string]ast.Node
	secrets map[string]bool // the values of secret keys
}

// maxDepth bounds the recursion (aliases of aliases); a loaded config is
// far shallower (precheck and the decoder's node budget).
const maxDepth = 200

// resolve follows anchors, aliases and tags to the node holding the value.
func (r *redactor) resolve(n ast.Node) ast.Node {
	for i := 0; i < 32 && n != nil; i++ {
		switch x := n.(type) {
		case *ast.AnchorNode:
			r.anchors[x.Name.String()] = x.Value
			n = x.Value
		case *ast.AliasNode:
			n = r.anchors[x.Value.String()]
		case *ast.TagNode:
			n = x.Value
		case *ast.CommentNode:
			return nil
		case *ast.MappingKeyNode:
			n = x.Value
		default:
			return n
		}
	}
	return n
}

// collect records the values of secret keys (first pass, so that a copy
// of a secret written before its key is redacted too).
func (r *redactor) collect(n ast.Node, secret bool, depth int) {
	if depth > maxDepth {
		return
	}
	n = r.resolve(n)
	switch x := n.(type) {
	case nil:
	case *ast.MappingNode:
		for _, mv := range x.Values {
			r.collect(mv, secret, depth+1)
		}
	case *ast.MappingValueNode:
		r.collect(x.Value, secret || isSecretKey(scalarText(r.resolve(x.Key))), depth+1)
	case *ast.SequenceNode:
		for _, it := range x.Values {
			r.collect(it, secret, depth+1)
		}
	default:
		if s := scalarText(n); secret && s != "" {
			r.secrets[s] = true
		}
	}
}

func (r *redactor) value(n ast.Node, secret bool, depth int) any {
	if depth > maxDepth {
		return Redacted
	}
	n = r.resolve(n)
	switch x := n.(type) {
	case nil, *ast.NullNode:
		return nil
	case *ast.MappingNode:
		out := make(yaml.MapSlice, 0, len(x.Values))
		for _, mv := range x.Values {
			out = append(out, r.item(mv, secret, depth+1))
		}
		return out
	case *ast.MappingValueNode:
		return yaml.MapSlice{r.item(x, secret, depth+1)}
	case *ast.SequenceNode:
		out := make([]any, 0, len(x.Values))
		for _, it := range x.Values {
			out = append(out, r.value(it, secret, depth+1))
		}
		return out
	case *ast.BoolNode:
		return x.Value
	case *ast.IntegerNode:
		return x.Value
	case *ast.FloatNode:
		return x.Value
	}
	s := scalarText(n)
	if secret && s != "" || r.secrets[s] {
		return Redacted
	}
	return RedactURL(s)
}

func (r *redactor) item(mv *ast.MappingValueNode, secret bool, depth int) yaml.MapItem {
	key := scalarText(r.resolve(mv.Key))
	return yaml.MapItem{Key: RedactURL(key), Value: r.value(mv.Value, secret || isSecretKey(key), depth)}
}

// RedactURL returns s without the user info ("user:pass@") when s is an
// absolute URL that has some, and s unchanged otherwise. It is decided
// from the parsed URL, not from a pattern.
func RedactURL(s string) string {
	if !strings.Contains(s, "@") {
		return s // no URL with user info (fast path; no allocation)
	}
	u, err := url.Parse(strings.TrimSpace(s))
	if err != nil {
		if i := strings.Index(s, "://"); i > 0 {
			return s[:i+3] + Redacted // unparseable URL-looking text with an @: hide it
		}
		return s
	}
	if u.User == nil {
		return s
	}
	u.User = nil
	return u.String()
}
