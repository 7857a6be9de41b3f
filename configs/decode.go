package configs

import (
	"bytes"
	"encoding"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
)

// Pos is a position in a config file.
type Pos struct {
	Line, Col int
}

// Error is one problem in a config file, reported as "file:line:col: message".
type Error struct {
	File string
	Pos
	Msg string
}

func (e *Error) Error() string {
	if e.Line == 0 {
		return fmt.Sprintf("%s: %s", e.File, e.Msg)
	}
	return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Col, e.Msg)
}

// Errors returns the individual config errors inside err, sorted by position.
func Errors(err error) []*Error {
	var out []*Error
	var walk func(error)
	walk = func(err error) {
		var e *Error
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
		} else if errors.As(err, &e) {
			out = append(out, e)
		} else if err != nil {
			out = append(out, &Error{Msg: err.Error()})
		}
	}
	walk(err)
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Line != out[j].Line {
			return out[i].Line < out[j].Line
		}
		return out[i].Col < out[j].Col
	})
	return out
}

var (
	durationType = reflect.TypeFor[time.Duration]()
	textType     = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// decoder turns a YAML syntax tree into Go values strictly: unknown keys,
// wrong types and bad durations are errors with the node's position. It
// records the position of every path it decodes ("routes[1].pool") so that
// validation can point at the entry it complains about.
type decoder struct {
	file    string
	errs    []error
	pos     map[string]Pos
	anchors map[string]ast.Node
	nodes   int  // nodes decoded so far, aliases' targets counted each time
	over    bool // the node budget was exceeded (reported once)
}

// Limits on a config or tenants file, checked before and while decoding so
// that a small hostile file (deep nesting, an alias bomb) cannot take the
// node's memory or CPU, on start or on reload (a reload over them is
// refused whole, like any invalid file).
const (
	// MaxFileBytes is the largest config or tenants file accepted.
	MaxFileBytes = 4 << 20
	// MaxFlowDepth bounds the nesting of flow collections ([ { ) in a file.
	MaxFlowDepth = 64
	// MaxBlockDepth bounds the nesting of block collections (indented
	// mappings and sequences, and compact "- - -" sequences on one line).
	// The YAML parser's cost grows with the square of this depth: 200 KB
	// of "- - - ..." took 44 s and 15 GB before it was bounded.
	MaxBlockDepth = 64
	// MaxNodes bounds the values decoded, each alias expansion counted
	// anew: the cost of an alias bomb, not its size on disk.
	MaxNodes = 200_000
)

// precheck refuses data over MaxFileBytes, with flow collections nested
// deeper than MaxFlowDepth or block collections nested deeper than
// MaxBlockDepth, before the YAML parser sees it. The flow depth scan skips
// quoted strings and comments.
func precheck(data []byte) string {
	if len(data) > MaxFileBytes {
		return fmt.Sprintf("file is %d bytes or more; the limit is %d", len(data), MaxFileBytes)
	}
	deep, values := scanBlocks(data)
	if deep > 0 {
		return fmt.Sprintf("line %d: block collections nested deeper than %d", deep, MaxBlockDepth)
	}
	if values > MaxNodes {
		return fmt.Sprintf("about %d values, more than %d (counted before parsing: lines, list items and flow entries)", values, MaxNodes)
	}
	depth := 0
	var quote byte
	comment := false
	for i, c := range data {
		switch {
		case comment:
			comment = c != '\n'
		case quote != 0:
			if c == quote && (quote == '\'' || i == 0 || data[i-1] != '\\') {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
		case c == '#':
			comment = true
		case c == '[' || c == '{':
			if depth++; depth > MaxFlowDepth {
				return fmt.Sprintf("collections nested deeper than %d", MaxFlowDepth)
			}
		case c == ']' || c == '}':
			if depth > 0 {
				depth--
			}
		}
	}
	return ""
}

// blockTooDeep returns the first line (1-based) at which block nesting
// passes MaxBlockDepth, or 0 (see scanBlocks).
func blockTooDeep(data []byte) int {
	deep, _ := scanBlocks(data)
	return deep
}

// scanBlocks makes one pass over the lines of data, before the YAML parser
// (whose time and memory grow faster than the file: a 4 MiB list took 9 s
// and 1.3 GB) sees them. It returns the first line (1-based) at which block
// nesting passes MaxBlockDepth, or 0, and an estimate of the values the
// file holds: one per line with content, one more per nested compact
// sequence ("- - x") and per flow collection or entry ("[", "{", ","),
// aliases counted once (expandedSize counts them on the tree). Lines of block scalars (| and >) and comments count
// nothing.
//
// For depth it keeps the stack of indentations of the enclosing lines, as
// the parser does, plus the compact sequence indicators ("- - x") a line
// opens. It estimates from above: a multi-line plain or quoted scalar
// whose lines indent further counts as deeper, which only matters past
// MaxBlockDepth distinct indentations.
func scanBlocks(data []byte) (deep, values int) {
	var stack []int // indentations of the enclosing lines
	scalarAt := -1  // inside a block scalar whose parent line is indented this much
	for n, start := 1, 0; start < len(data); n++ {
		end := len(data)
		if i := bytes.IndexByte(data[start:], '\n'); i >= 0 {
			end = start + i
		}
		line := data[start:end]
		start = end + 1
		indent := 0
		for indent < len(line) && line[indent] == ' ' {
			indent++
		}
		rest := line[indent:]
		if len(rest) == 0 || rest[0] == '#' || rest[0] == '\r' {
			continue // blank or comment: no structure
		}
		if scalarAt >= 0 {
			if indent > scalarAt {
				continue // block scalar text
			}
			scalarAt = -1
		}
		for len(stack) > 0 && stack[len(stack)-1] >= indent {
			stack = stack[:len(stack)-1]
		}
		stack = append(stack, indent)
		depth := len(stack)
		for dashes := 0; len(rest) >= 2 && rest[0] == '-' && (rest[1] == ' ' || rest[1] == '\t'); dashes++ {
			depth++
			if dashes > 0 {
				values++ // a nested sequence opened on this line
			}
			rest = rest[2:]
			for len(rest) > 0 && (rest[0] == ' ' || rest[0] == '\t') {
				rest = rest[1:]
			}
		}
		if depth > MaxBlockDepth {
			return n, values
		}
		values++
		if i := bytes.Index(rest, []byte(" #")); i >= 0 {
			rest = rest[:i]
		}
		for _, c := range rest {
			if c == ',' || c == '[' || c == '{' {
				values++
			}
		}
		if opensBlockScalar(rest) {
			scalarAt = indent
		}
	}
	return 0, values
}

// opensBlockScalar reports whether a line ends with a block scalar header
// ("key: |", "- >-", "key: |2 # note").
func opensBlockScalar(line []byte) bool {
	if i := bytes.Index(line, []byte(" #")); i >= 0 {
		line = line[:i]
	}
	for len(line) > 0 && (line[len(line)-1] == ' ' || line[len(line)-1] == '\r' || line[len(line)-1] == '\t') {
		line = line[:len(line)-1]
	}
	for len(line) > 0 && (line[len(line)-1] == '+' || line[len(line)-1] == '-' || (line[len(line)-1] >= '1' && line[len(line)-1] <= '9')) {
		line = line[:len(line)-1]
	}
	if len(line) == 0 || (line[len(line)-1] != '|' && line[len(line)-1] != '>') {
		return false
	}
	return len(line) == 1 || line[len(line)-2] == ' '
}

// expandedSize counts the values of a syntax tree as the decoder would
// see them: an alias counts the whole value it names, each time it is
// used. It stops counting once the total passes limit, so a billion-laughs
// file is refused from its tree, before anything is decoded.
func expandedSize(n ast.Node, limit int, sizes map[string]int) int {
	if n == nil {
		return 0
	}
	switch x := n.(type) {
	case *ast.DocumentNode:
		return expandedSize(x.Body, limit, sizes)
	case *ast.AnchorNode:
		size := expandedSize(x.Value, limit, sizes)
		sizes[x.Name.String()] = size
		return size
	case *ast.AliasNode:
		return max(sizes[x.Value.String()], 1)
	case *ast.TagNode:
		return expandedSize(x.Value, limit, sizes)
	case *ast.MappingNode:
		total := 1
		for _, v := range x.Values {
			if total += expandedSize(v, limit-total, sizes); total > limit {
				return total
			}
		}
		return total
	case *ast.MappingValueNode:
		total := 1 + expandedSize(x.Key, limit, sizes)
		return total + expandedSize(x.Value, limit-total, sizes)
	case *ast.SequenceNode:
		total := 1
		for _, v := range x.Values {
			if total += expandedSize(v, limit-total, sizes); total > limit {
				return total
			}
		}
		return total
	}
	return 1
}

func newDecoder(file string) *decoder {
	return &decoder{file: file, pos: map[string]Pos{}, anchors: map[string]ast.Node{}}
}

func (d *decoder) errorf(p Pos, format string, args ...any) {
	d.errs = append(d.errs, &Error{File: d.file, Pos: p, Msg: fmt.Sprintf(format, args...)})
}

// nodePos is where a node starts; a mapping starts at its first key.
func nodePos(n ast.Node) Pos {
	switch m := n.(type) {
	case *ast.MappingNode:
		if len(m.Values) > 0 {
			return nodePos(m.Values[0].Key)
		}
	case *ast.MappingValueNode:
		return nodePos(m.Key)
	}
	if n == nil || n.GetToken() == nil {
		return Pos{}
	}
	t := n.GetToken().Position
	return Pos{Line: t.Line, Col: t.Column}
}

// parse decodes data into v (a pointer to a struct).
func (d *decoder) parse(data []byte, v any) {
	if f := d.parseFile(data); f != nil {
		d.decode(f.Docs[0].Body, reflect.ValueOf(v).Elem(), "")
	}
}

// parseFile parses data into a syntax tree with one document, or returns
// nil: after a syntax error (recorded), or when the file is empty.
func (d *decoder) parseFile(data []byte) *ast.File {
	if msg := precheck(data); msg != "" {
		d.errorf(Pos{1, 1}, "%s", msg)
		return nil
	}
	f, err := parser.ParseBytes(data, 0)
	if err != nil {
		var se *yaml.SyntaxError
		if errors.As(err, &se) && se.Token != nil {
			d.errorf(Pos{se.Token.Position.Line, se.Token.Position.Column}, "%s", se.Message)
		} else {
			d.errorf(Pos{1, 1}, "%v", err)
		}
		return nil
	}
	if len(f.Docs) == 0 || f.Docs[0].Body == nil {
		return nil
	}
	if len(f.Docs) > 1 {
		d.errorf(nodePos(f.Docs[1]), "a config file holds one YAML document")
	}
	if size := expandedSize(f.Docs[0].Body, MaxNodes, map[string]int{}); size > MaxNodes {
		d.errorf(Pos{1, 1}, "more than %d values once aliases are expanded (an alias counts the value it names each time it is used)", MaxNodes)
		return nil
	}
	return f
}

// resolve follows anchors, aliases and tags to the node that holds the value.
func (d *decoder) resolve(n ast.Node) ast.Node {
	for depth := 0; depth < 32; depth++ {
		switch x := n.(type) {
		case *ast.AnchorNode:
			d.anchors[x.Name.String()] = x.Value
			n = x.Value
		case *ast.AliasNode:
			target, ok := d.anchors[x.Value.String()]
			if !ok {
				d.errorf(nodePos(x), "unknown alias %q", x.Value.String())
				return nil
			}
			n = target
		case *ast.TagNode:
			n = x.Value
		case *ast.CommentNode:
			return nil
		default:
			return n
		}
	}
	return n
}

func (d *decoder) decode(n ast.Node, v reflect.Value, path string) {
	if d.nodes++; d.nodes > MaxNodes {
		if !d.over {
			d.over = true
			d.errorf(nodePos(n), "more than %d values (aliases counted each time they are used)", MaxNodes)
		}
		return
	}
	n = d.resolve(n)
	if n == nil {
		return
	}
	p := nodePos(n)
	if path != "" {
		d.pos[path] = p
	}
	if _, isNull := n.(*ast.NullNode); isNull {
		return // null leaves the zero value (and so the default)
	}
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		d.decode(n, v.Elem(), path)
		return
	}
	if isScalarType(v.Type()) {
		d.decodeScalar(n, v, path)
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		d.decodeStruct(n, v, path)
	case reflect.Map:
		d.decodeMap(n, v, path)
	case reflect.Slice:
		d.decodeSlice(n, v, path)
	default:
		d.decodeScalar(n, v, path)
	}
}

// isScalarType reports whether values of t are written as one scalar even
// though t is a struct or slice: durations and text unmarshalers.
func isScalarType(t reflect.Type) bool {
	return t == durationType || reflect.PointerTo(t).Implements(textType)
}

func describe(path string) string {
	if path == "" {
		return "config"
	}
	return path
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func (d *decoder) mapping(n ast.Node, path string) ([]*ast.MappingValueNode, bool) {
	switch m := n.(type) {
	case *ast.MappingNode:
		return m.Values, true
	case *ast.MappingValueNode:
		return []*ast.MappingValueNode{m}, true
	}
	d.errorf(nodePos(n), "%s: expected a mapping (key: value), got %s", describe(path), kindOf(n))
	return nil, false
}

func kindOf(n ast.Node) string {
	switch n.(type) {
	case *ast.SequenceNode:
		return "a list"
	case *ast.MappingNode, *ast.MappingValueNode:
		return "a mapping"
	}
	return fmt.Sprintf("%q", scalarText(n))
}

// fieldIndexes caches fieldIndex per struct type (a large tenants list
// decodes the same two types 100,000 times).
var fieldIndexes sync.Map // reflect.Type -> map[string][]int

// fieldIndex maps YAML keys to struct fields, following ",inline" structs.
// The result is shared and must not be modified.
func fieldIndex(t reflect.Type) map[string][]int {
	if m, ok := fieldIndexes.Load(t); ok {
		return m.(map[string][]int)
	}
	m := buildFieldIndex(t)
	fieldIndexes.Store(t, m)
	return m
}

func buildFieldIndex(t reflect.Type) map[string][]int {
	out := map[string][]int{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("yaml")
		if tag == "-" || !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if opts == "inline" {
			for k, idx := range buildFieldIndex(f.Type) {
				out[k] = append([]int{i}, idx...)
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = []int{i}
	}
	return out
}

func (d *decoder) decodeStruct(n ast.Node, v reflect.Value, path string) {
	values, ok := d.mapping(n, path)
	if !ok {
		return
	}
	fields := fieldIndex(v.Type())
	for _, mv := range values {
		key := scalarText(mv.Key)
		idx, ok := fields[key]
		if !ok {
			d.errorf(nodePos(mv.Key), "unknown key %q in %s%s", key, describe(path), suggest(key, fields))
			continue
		}
		d.pos[join(path, key)+"#key"] = nodePos(mv.Key)
		d.decode(mv.Value, v.FieldByIndex(idx), join(path, key))
	}
}

// suggest names the closest known key when the unknown one looks like a typo.
func suggest(key string, fields map[string][]int) string {
	best, bestDist := "", 3
	for k := range fields {
		if dist := editDistance(key, k); dist < bestDist || (dist == bestDist && k < best) {
			best, bestDist = k, dist
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

func (d *decoder) decodeMap(n ast.Node, v reflect.Value, path string) {
	values, ok := d.mapping(n, path)
	if !ok {
		return
	}
	if v.Type().Key().Kind() != reflect.String {
		d.errorf(nodePos(n), "%s: unsupported map key type", describe(path))
		return
	}
	if v.IsNil() {
		v.Set(reflect.MakeMap(v.Type()))
	}
	for _, mv := range values {
		key := scalarText(mv.Key)
		elem := reflect.New(v.Type().Elem()).Elem()
		d.decode(mv.Value, elem, join(path, key))
		v.SetMapIndex(reflect.ValueOf(key).Convert(v.Type().Key()), elem)
	}
}

func (d *decoder) decodeSlice(n ast.Node, v reflect.Value, path string) {
	seq, ok := n.(*ast.SequenceNode)
	if !ok {
		d.errorf(nodePos(n), "%s: expected a list, got %s", describe(path), kindOf(n))
		return
	}
	out := reflect.MakeSlice(v.Type(), len(seq.Values), len(seq.Values))
	for i, item := range seq.Values {
		d.decode(item, out.Index(i), fmt.Sprintf("%s[%d]", path, i))
	}
	v.Set(out)
}

// scalarText is the text of a scalar node as written (without quotes).
func scalarText(n ast.Node) string {
	switch x := n.(type) {
	case *ast.StringNode:
		return x.Value
	case *ast.LiteralNode:
		return x.Value.Value
	case *ast.MappingKeyNode:
		return scalarText(x.Value)
	case ast.ScalarNode:
		if t := x.GetToken(); t != nil {
			return t.Value
		}
	}
	if n == nil {
		return ""
	}
	return n.String()
}

func (d *decoder) scalar(n ast.Node, path string) (string, bool) {
	switch n.(type) {
	case *ast.MappingNode, *ast.MappingValueNode, *ast.SequenceNode:
		d.errorf(nodePos(n), "%s: expected a single value, got %s", describe(path), kindOf(n))
		return "", false
	}
	return scalarText(n), true
}

func (d *decoder) decodeScalar(n ast.Node, v reflect.Value, path string) {
	s, ok := d.scalar(n, path)
	if !ok {
		return
	}
	if err := setScalar(v, s); err != nil {
		d.errorf(nodePos(n), "%s: %v", describe(path), err)
	}
}

// setScalar parses the scalar text s into v: a duration, a value whose
// pointer implements encoding.TextUnmarshaler, a string, bool or number.
// The error reads well after "path: ".
func setScalar(v reflect.Value, s string) error {
	if v.Type() == durationType {
		dur, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("bad duration %q (use Go durations such as \"250ms\", \"30s\", \"5m\")", s)
		}
		if dur < 0 {
			return fmt.Errorf("duration %q must not be negative", s)
		}
		v.SetInt(int64(dur))
		return nil
	}
	if reflect.PointerTo(v.Type()).Implements(textType) {
		return v.Addr().Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(s))
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(s)
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("expected true or false, got %q", s)
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		i, err := strconv.ParseInt(strings.ReplaceAll(s, "_", ""), 0, v.Type().Bits())
		if err != nil {
			return fmt.Errorf("expected a whole number, got %q", s)
		}
		v.SetInt(i)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		u, err := strconv.ParseUint(strings.ReplaceAll(s, "_", ""), 0, v.Type().Bits())
		if err != nil {
			return fmt.Errorf("expected a non-negative whole number, got %q", s)
		}
		v.SetUint(u)
	case reflect.Float32, reflect.Float64:
		f, err := strconv.ParseFloat(s, v.Type().Bits())
		if err != nil {
			return fmt.Errorf("expected a number, got %q", s)
		}
		v.SetFloat(f)
	default:
		return fmt.Errorf("unsupported type %s", v.Type())
	}
	return nil
}
