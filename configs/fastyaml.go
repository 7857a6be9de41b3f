package configs

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The tenants file can hold 100,000 tenants. goccy/go-yaml's parser takes
// tens of seconds on such a file (its time grows faster than the file), so
// the tenants file is read by a small scanner for the block-style YAML that
// people and generators write: block mappings and sequences, plain and
// quoted scalars, one-line flow lists ("[a, b]"), comments. It builds a light
// tree (fnode) that fdecode turns into Go values with the same rules and
// messages as the general decoder. Anything else (anchors, tags, block
// scalars, flow mappings, multi-line scalars, several documents) makes the
// scanner give up with errUnsupported, and the general parser reads the file.

// errUnsupported means the text uses YAML the fast scanner does not read.
var errUnsupported = errors.New("yaml outside the fast subset")

type fkind uint8

const (
	fNull fkind = iota
	fScalar
	fMap
	fSeq
)

// fnode is a node of the light tree.
type fnode struct {
	kind    fkind
	pos     Pos
	text    string   // fScalar
	entries []fentry // fMap
	items   []*fnode // fSeq
}

type fentry struct {
	key    string
	keyPos Pos
	val    *fnode
}

// fline is one line holding content: its indentation and the text after it.
type fline struct {
	num    int
	indent int
	text   string
}

// fparser scans the lines into a tree. Definite syntax errors (a duplicate
// key, a tab in indentation) are reported; anything it does not understand
// is errUnsupported. Nodes, entries and items come from chunked arenas: a
// large file makes a few big allocations, not millions of small ones.
type fparser struct {
	file  string
	lines []fline
	i     int
	err   error

	nodes     []fnode
	entries   []fentry // scratch: entries of the open mappings
	items     []*fnode // scratch: items of the open sequences
	entArena  []fentry
	itemArena []*fnode
}

const arenaChunk = 4096

func (p *fparser) node(kind fkind, pos Pos) *fnode {
	if len(p.nodes) == cap(p.nodes) {
		p.nodes = make([]fnode, 0, arenaChunk)
	}
	p.nodes = append(p.nodes, fnode{kind: kind, pos: pos})
	return &p.nodes[len(p.nodes)-1]
}

// keepEntries moves the scratch entries from start on into the arena.
func (p *fparser) keepEntries(start int) []fentry {
	es := p.entries[start:]
	if len(p.entArena)+len(es) > cap(p.entArena) {
		p.entArena = make([]fentry, 0, max(arenaChunk, len(es)))
	}
	n := len(p.entArena)
	p.entArena = append(p.entArena, es...)
	p.entries = p.entries[:start]
	return p.entArena[n:len(p.entArena):len(p.entArena)]
}

// keepItems moves the scratch items from start on into the arena.
func (p *fparser) keepItems(start int) []*fnode {
	is := p.items[start:]
	if len(p.itemArena)+len(is) > cap(p.itemArena) {
		p.itemArena = make([]*fnode, 0, max(arenaChunk, len(is)))
	}
	n := len(p.itemArena)
	p.itemArena = append(p.itemArena, is...)
	p.items = p.items[:start]
	return p.itemArena[n:len(p.itemArena):len(p.itemArena)]
}

// fastParse builds the light tree of data, or returns errUnsupported, or a
// syntax error (*Error).
func fastParse(file string, data []byte) (*fnode, error) {
	p := &fparser{file: file}
	if err := p.split(string(data)); err != nil {
		return nil, err
	}
	if len(p.lines) == 0 {
		return p.node(fNull, Pos{1, 1}), nil
	}
	root := p.block()
	if p.err == nil && p.i < len(p.lines) {
		p.err = errUnsupported // e.g. a key after a top-level list
	}
	if p.err != nil {
		return nil, p.err
	}
	return root, nil
}

// split keeps the lines with content and notes their indentation.
func (p *fparser) split(s string) error {
	s = strings.TrimPrefix(s, "\uFEFF")
	if !utf8.ValidString(s) || hasControl(s) {
		return errUnsupported
	}
	p.lines = make([]fline, 0, strings.Count(s, "\n")+1)
	num := 0
	for len(s) > 0 {
		num++
		line := s
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			line, s = s[:i], s[i+1:]
		} else {
			s = ""
		}
		line = strings.TrimSuffix(line, "\r")
		indent := 0
		for indent < len(line) && line[indent] == ' ' {
			indent++
		}
		text := strings.TrimRight(line[indent:], " \t")
		if text == "" || text[0] == '#' {
			continue
		}
		if text[0] == '\t' {
			if t := strings.TrimLeft(text, " \t"); t == "" || t[0] == '#' {
				continue
			}
			return &Error{File: p.file, Pos: Pos{num, indent + 1}, Msg: "found a tab character where an indentation space is expected"}
		}
		if indent == 0 && (strings.HasPrefix(text, "---") || strings.HasPrefix(text, "...") || text[0] == '%') {
			if text == "---" && len(p.lines) == 0 {
				continue // the usual start-of-document marker
			}
			return errUnsupported
		}
		p.lines = append(p.lines, fline{num: num, indent: indent, text: text})
	}
	return nil
}

// hasControl reports control characters other than tab, line feed and a
// carriage return before a line feed (a lone CR breaks lines too).
func hasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= ' ' || c == '\t' || c == '\n' {
			continue
		}
		if c != '\r' || i+1 == len(s) || s[i+1] != '\n' {
			return true
		}
	}
	return false
}

func (p *fparser) fail(err error) {
	if p.err == nil {
		p.err = err
	}
}

func (p *fparser) done() bool { return p.err != nil || p.i >= len(p.lines) }

func isSeqItem(text string) bool {
	return text == "-" || strings.HasPrefix(text, "- ")
}

// block reads the node starting at the current line.
func (p *fparser) block() *fnode {
	l := p.lines[p.i]
	if isSeqItem(l.text) {
		return p.seq(l.indent)
	}
	return p.mapping(l.indent)
}

// seq reads a block sequence whose dashes are at column ind.
func (p *fparser) seq(ind int) *fnode {
	n := p.node(fSeq, Pos{p.lines[p.i].num, ind + 1})
	start := len(p.items)
	defer func() { n.items = p.keepItems(start) }()
	for !p.done() {
		l := &p.lines[p.i]
		if l.indent < ind || (l.indent == ind && !isSeqItem(l.text)) {
			break
		}
		if l.indent > ind {
			p.fail(errUnsupported)
			break
		}
		rest := strings.TrimLeft(l.text[1:], " ")
		col := ind + len(l.text) - len(rest) // 0-based column of rest
		var item *fnode
		switch {
		case rest == "" || rest[0] == '#':
			p.i++
			if p.done() || p.lines[p.i].indent <= ind {
				p.fail(errUnsupported) // an empty item: rare, and parsers differ
				return n
			}
			item = p.block()
		case isSeqItem(rest):
			p.fail(errUnsupported) // "- - a"
		default:
			if _, _, ok := splitKey(rest); ok {
				l.indent, l.text = col, rest // a mapping that starts on the dash's line
				item = p.mapping(col)
			} else {
				item = p.value(rest, Pos{l.num, col + 1})
				p.i++
			}
		}
		p.items = append(p.items, item)
	}
	return n
}

// childOrNull reads the block below a key or dash at indentation ind, or
// returns a null at pos when there is none.
func (p *fparser) childOrNull(ind int, pos Pos) *fnode {
	if !p.done() {
		next := p.lines[p.i]
		if next.indent > ind {
			return p.block()
		}
	}
	return p.node(fNull, pos)
}

// mapping reads a block mapping whose keys are at column ind.
func (p *fparser) mapping(ind int) *fnode {
	n := p.node(fMap, Pos{p.lines[p.i].num, ind + 1})
	start := len(p.entries)
	defer func() { n.entries = p.keepEntries(start) }()
	for !p.done() {
		l := p.lines[p.i]
		if l.indent < ind || (l.indent == ind && isSeqItem(l.text)) {
			break
		}
		if l.indent > ind {
			p.fail(errUnsupported) // a multi-line scalar, or bad indentation
			break
		}
		key, rest, ok := splitKey(l.text)
		if !ok {
			p.fail(errUnsupported)
			break
		}
		kpos := Pos{l.num, ind + 1}
		for _, e := range p.entries[start:] {
			if e.key == key {
				p.fail(&Error{File: p.file, Pos: kpos, Msg: fmt.Sprintf("mapping key %q already defined at [%d:%d]", key, e.keyPos.Line, e.keyPos.Col)})
			}
		}
		p.i++
		var val *fnode
		if rest == "" || rest[0] == '#' {
			val = p.mapValueBlock(ind, kpos)
		} else {
			val = p.value(rest, Pos{l.num, ind + len(l.text) - len(rest) + 1})
		}
		p.entries = append(p.entries, fentry{key: key, keyPos: kpos, val: val})
	}
	return n
}

// mapValueBlock reads the value of a key written alone on its line: a
// block indented more, a sequence at the key's own indentation, or null.
func (p *fparser) mapValueBlock(ind int, kpos Pos) *fnode {
	if !p.done() {
		next := p.lines[p.i]
		if next.indent == ind && isSeqItem(next.text) {
			return p.seq(ind)
		}
	}
	return p.childOrNull(ind, kpos)
}

// splitKey splits "key: rest" (rest without leading blanks). ok is false
// when text is not a simple key followed by ": " or a final ":".
func splitKey(text string) (key, rest string, ok bool) {
	if text[0] == '"' || text[0] == '\'' {
		k, after, ok := quoted(text)
		if !ok || !strings.HasPrefix(after, ":") {
			return "", "", false
		}
		after = after[1:]
		if after != "" && after[0] != ' ' && after[0] != '\t' {
			return "", "", false
		}
		return k, strings.TrimLeft(after, " \t"), true
	}
	if !plainStart(text) {
		return "", "", false
	}
	for i := 0; i < len(text); i++ {
		switch text[i] {
		case '#':
			if text[i-1] == ' ' || text[i-1] == '\t' {
				return "", "", false // a comment before any ": "
			}
		case ':':
			if i+1 == len(text) || text[i+1] == ' ' || text[i+1] == '\t' {
				return strings.TrimRight(text[:i], " \t"), strings.TrimLeft(text[i+1:], " \t"), true
			}
		}
	}
	return "", "", false
}

// value reads a scalar or one-line flow list written after a key or dash.
func (p *fparser) value(s string, pos Pos) *fnode {
	switch s[0] {
	case '[':
		return p.flowList(s, pos)
	case '{':
		return p.flowMap(s, pos)
	case '"', '\'':
		v, after, ok := quoted(s)
		if !ok || !blankOrComment(after) {
			p.fail(errUnsupported) // multi-line or escaped: the general parser reads it
			return nil
		}
		return p.scalar(pos, v)
	}
	if !plainStart(s) {
		p.fail(errUnsupported)
		return nil
	}
	v := plainText(s)
	if strings.Contains(v, ": ") || strings.HasSuffix(v, ":") || strings.Contains(v, " #") {
		p.fail(errUnsupported)
		return nil
	}
	switch v {
	case "~", "null", "Null", "NULL":
		return p.node(fNull, pos)
	}
	return p.scalar(pos, v)
}

func (p *fparser) scalar(pos Pos, text string) *fnode {
	n := p.node(fScalar, pos)
	n.text = text
	return n
}

// plainStart reports whether s starts like a plain scalar the fast path
// reads: a letter, digit or one of "-+._/$~=^(" ("-" not followed by a
// blank). YAML's indicators and anything unusual go to the general parser.
func plainStart(s string) bool {
	c := s[0]
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	case c == '-':
		return len(s) > 1 && s[1] != ' ' && s[1] != '\t'
	}
	return strings.IndexByte("+._/$~=^(", c) >= 0
}

// plainText is a plain scalar without a trailing comment.
func plainText(s string) string {
	for i := 1; i < len(s); i++ {
		if s[i] == '#' && (s[i-1] == ' ' || s[i-1] == '\t') {
			return strings.TrimRight(s[:i], " \t")
		}
	}
	return s
}

func blankOrComment(s string) bool {
	s = strings.TrimLeft(s, " \t")
	return s == "" || s[0] == '#'
}

// quoted reads a quoted scalar at the start of s; ok is false when it does
// not end on this line or uses escapes (which the general parser handles).
func quoted(s string) (val, after string, ok bool) {
	q := s[0]
	if q == '"' {
		end := strings.IndexByte(s[1:], '"')
		if end < 0 || strings.IndexByte(s[1:end+1], '\\') >= 0 {
			return "", "", false
		}
		return s[1 : end+1], s[end+2:], true
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		if s[i] != '\'' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == '\'' {
			b.WriteByte('\'')
			i++
			continue
		}
		return b.String(), s[i+1:], true
	}
	return "", "", false
}

// flowList reads "[a, 'b', c]" on one line.
func (p *fparser) flowList(s string, pos Pos) *fnode {
	n := p.node(fSeq, pos)
	start := len(p.items)
	defer func() { n.items = p.keepItems(start) }()
	rest := strings.TrimLeft(s[1:], " \t")
	for {
		if rest == "" {
			p.fail(errUnsupported) // continues on the next line
			return n
		}
		if rest[0] == ']' {
			if !blankOrComment(rest[1:]) {
				p.fail(errUnsupported)
			}
			return n
		}
		itemPos := Pos{pos.Line, pos.Col + len(s) - len(rest)}
		var item string
		switch rest[0] {
		case '"', '\'':
			v, after, ok := quoted(rest)
			if !ok {
				p.fail(errUnsupported)
				return n
			}
			item, rest = v, after
		default:
			if !plainStart(rest) {
				p.fail(errUnsupported)
				return n
			}
			end := strings.IndexAny(rest, ",]")
			if end < 0 {
				p.fail(errUnsupported)
				return n
			}
			item, rest = strings.TrimRight(rest[:end], " \t"), rest[end:]
			if strings.Contains(item, " #") || strings.Contains(item, ": ") || strings.HasSuffix(item, ":") || strings.ContainsAny(item, "[{}") {
				p.fail(errUnsupported)
				return n
			}
		}
		p.items = append(p.items, p.scalar(itemPos, item))
		rest = strings.TrimLeft(rest, " \t")
		switch {
		case strings.HasPrefix(rest, ","):
			rest = strings.TrimLeft(rest[1:], " \t")
		case !strings.HasPrefix(rest, "]"):
			p.fail(errUnsupported)
			return n
		}
	}
}

// flowMap reads a one-line flow mapping of scalars: "{a: 1, 'b': x}".
func (p *fparser) flowMap(s string, pos Pos) *fnode {
	n := p.node(fMap, pos)
	start := len(p.entries)
	defer func() { n.entries = p.keepEntries(start) }()
	rest := strings.TrimLeft(s[1:], " \t")
	for {
		if rest == "" {
			p.fail(errUnsupported) // continues on the next line
			return n
		}
		if rest[0] == '}' {
			if !blankOrComment(rest[1:]) {
				p.fail(errUnsupported)
			}
			return n
		}
		kpos := Pos{pos.Line, pos.Col + len(s) - len(rest)}
		end := strings.IndexAny(rest, ",}")
		if end < 0 || strings.ContainsAny(rest[:end], "[{\"'&*!#") {
			p.fail(errUnsupported) // quoted or nested: the general parser reads it
			return n
		}
		key, val, ok := strings.Cut(rest[:end], ": ")
		if !ok || strings.Contains(val, ": ") {
			p.fail(errUnsupported)
			return n
		}
		key = strings.TrimSpace(key)
		for _, e := range p.entries[start:] {
			if e.key == key {
				p.fail(&Error{File: p.file, Pos: kpos, Msg: fmt.Sprintf("mapping key %q already defined at [%d:%d]", key, e.keyPos.Line, e.keyPos.Col)})
				return n
			}
		}
		trimmed := strings.TrimLeft(val, " \t")
		vpos := Pos{pos.Line, kpos.Col + strings.Index(rest, ":") + 1 + len(val) - len(trimmed)}
		var v *fnode
		if trimmed = strings.TrimRight(trimmed, " \t"); trimmed == "" {
			v = p.node(fNull, vpos)
		} else {
			v = p.value(trimmed, vpos)
		}
		p.entries = append(p.entries, fentry{key: key, keyPos: kpos, val: v})
		rest = strings.TrimLeft(rest[end:], " \t")
		if strings.HasPrefix(rest, ",") {
			rest = strings.TrimLeft(rest[1:], " \t")
		}
	}
}

// fdecoder turns a light tree into Go values strictly, like decoder does a
// goccy syntax tree: unknown keys, wrong types and bad values are errors
// at the node's position. The path is kept as a stack of segments and
// formatted only for an error.
type fdecoder struct {
	file string
	errs []error
	path []fseg
}

// fseg is one path segment: a key, or an index when key is empty.
type fseg struct {
	key   string
	index int
}

func (d *fdecoder) pathString() string {
	s := ""
	for _, g := range d.path {
		if g.key == "" {
			s += "[" + strconv.Itoa(g.index) + "]"
		} else {
			s = join(s, g.key)
		}
	}
	return describe(s)
}

func (d *fdecoder) errorf(pos Pos, format string, args ...any) {
	d.errs = append(d.errs, &Error{File: d.file, Pos: pos, Msg: fmt.Sprintf(format, args...)})
}

// decode decodes n into v at the path seg below the current one.
func (d *fdecoder) decode(n *fnode, v reflect.Value, seg fseg) {
	d.path = append(d.path, seg)
	defer func() { d.path = d.path[:len(d.path)-1] }()
	d.value(n, v)
}

func (d *fdecoder) value(n *fnode, v reflect.Value) {
	if n == nil || n.kind == fNull {
		return
	}
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		d.value(n, v.Elem())
		return
	}
	if isScalarType(v.Type()) {
		d.scalar(n, v)
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		d.decodeStruct(n, v)
	case reflect.Map:
		d.decodeMap(n, v)
	case reflect.Slice:
		d.decodeSlice(n, v)
	default:
		d.scalar(n, v)
	}
}

func kindOfF(n *fnode) string {
	switch n.kind {
	case fSeq:
		return "a list"
	case fMap:
		return "a mapping"
	}
	return strconv.Quote(n.text)
}

func (d *fdecoder) scalar(n *fnode, v reflect.Value) {
	if n.kind != fScalar {
		d.errorf(n.pos, "%s: expected a single value, got %s", d.pathString(), kindOfF(n))
		return
	}
	if err := setScalar(v, n.text); err != nil {
		d.errorf(n.pos, "%s: %v", d.pathString(), err)
	}
}

func (d *fdecoder) isMapping(n *fnode) bool {
	if n.kind != fMap {
		d.errorf(n.pos, "%s: expected a mapping (key: value), got %s", d.pathString(), kindOfF(n))
		return false
	}
	return true
}

func (d *fdecoder) decodeStruct(n *fnode, v reflect.Value) {
	if !d.isMapping(n) {
		return
	}
	fields := fieldIndex(v.Type())
	for _, e := range n.entries {
		idx, ok := fields[e.key]
		if !ok {
			d.errorf(e.keyPos, "unknown key %q in %s%s", e.key, d.pathString(), suggest(e.key, fields))
			continue
		}
		d.decode(e.val, v.FieldByIndex(idx), fseg{key: e.key})
	}
}

func (d *fdecoder) decodeMap(n *fnode, v reflect.Value) {
	if !d.isMapping(n) {
		return
	}
	if v.Type().Key().Kind() != reflect.String {
		d.errorf(n.pos, "%s: unsupported map key type", d.pathString())
		return
	}
	if v.IsNil() {
		v.Set(reflect.MakeMapWithSize(v.Type(), len(n.entries)))
	}
	for _, e := range n.entries {
		elem := reflect.New(v.Type().Elem()).Elem()
		d.decode(e.val, elem, fseg{key: e.key})
		v.SetMapIndex(reflect.ValueOf(e.key).Convert(v.Type().Key()), elem)
	}
}

func (d *fdecoder) decodeSlice(n *fnode, v reflect.Value) {
	if n.kind != fSeq {
		d.errorf(n.pos, "%s: expected a list, got %s", d.pathString(), kindOfF(n))
		return
	}
	out := reflect.MakeSlice(v.Type(), len(n.items), len(n.items))
	for i, item := range n.items {
		d.decode(item, out.Index(i), fseg{index: i})
	}
	v.Set(out)
}
