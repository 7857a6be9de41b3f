package loadgen

import (
	"math"
	"strconv"
	"strings"
)

// Metric is one W3C Server-Timing metric.
type Metric struct {
	// Name is the metric name, e.g. "queue".
	Name string `json:"name"`
	// Dur is the dur parameter in milliseconds. Valid only when HasDur.
	// (Sluice before 2026-12 put its "tokens" and "tps" counts in dur;
	// it now sends them as desc: see Value.)
	Dur float64 `json:"dur"`
	// HasDur reports whether a numeric dur parameter was present.
	HasDur bool `json:"has_dur"`
	// Desc is the desc parameter; empty when absent.
	Desc string `json:"desc,omitempty"`
}

// ParseServerTiming appends the metrics of each Server-Timing header value
// (or trailer, or SSE "server-timing" comment payload) to dst, following
// the W3C grammar: comma-separated entries `name *(; param=value)`, values
// tokens or quoted strings with backslash escapes, parameter names case
// insensitive, the first dur and desc of an entry winning. An entry that
// does not parse is skipped as a whole; a dur that is not a finite number
// leaves HasDur false. Never fails.
func ParseServerTiming(dst []Metric, values ...string) []Metric {
	for _, v := range values {
		p := stParser{s: v}
		for p.more() {
			if m, ok := p.entry(); ok {
				dst = append(dst, m)
			}
		}
	}
	return dst
}

// Value is the metric's number: its dur when it has one, else its desc
// read as a number (Sluice's "tokens" and "tps", a count and a rate, are
// sent as desc="12" so that browsers do not show them as milliseconds).
func (m Metric) Value() (float64, bool) {
	if m.HasDur {
		return m.Dur, true
	}
	if m.Desc == "" {
		return 0, false
	}
	v, err := strconv.ParseFloat(m.Desc, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

// Lookup returns the dur of the first metric called name.
func Lookup(ms []Metric, name string) (float64, bool) {
	for _, m := range ms {
		if m.Name == name && m.HasDur {
			return m.Dur, true
		}
	}
	return 0, false
}

type stParser struct {
	s string
	i int
}

// more skips separators and reports whether an entry may follow.
func (p *stParser) more() bool {
	for p.i < len(p.s) && (p.s[p.i] == ',' || isOWS(p.s[p.i])) {
		p.i++
	}
	return p.i < len(p.s)
}

// entry parses one metric and leaves p just past it (at a comma or the end).
func (p *stParser) entry() (Metric, bool) {
	m := Metric{Name: p.token()}
	if m.Name == "" {
		p.skipEntry()
		return m, false
	}
	var seenDur, seenDesc bool
	for {
		p.skipOWS()
		if p.i >= len(p.s) || p.s[p.i] == ',' {
			return m, true
		}
		if p.s[p.i] != ';' {
			p.skipEntry()
			return m, false
		}
		p.i++
		p.skipOWS()
		name := p.token()
		if name == "" {
			p.skipEntry()
			return m, false
		}
		p.skipOWS()
		val, ok := "", true
		if p.i < len(p.s) && p.s[p.i] == '=' {
			p.i++
			p.skipOWS()
			val, ok = p.value()
		}
		if !ok {
			p.skipEntry()
			return m, false
		}
		switch {
		case strings.EqualFold(name, "dur") && !seenDur:
			seenDur = true
			if d, err := strconv.ParseFloat(val, 64); err == nil && !math.IsNaN(d) && !math.IsInf(d, 0) {
				m.Dur, m.HasDur = d, true
			}
		case strings.EqualFold(name, "desc") && !seenDesc:
			seenDesc = true
			m.Desc = val
		}
	}
}

// value reads a token or a quoted string (backslash escapes any byte).
func (p *stParser) value() (string, bool) {
	if p.i >= len(p.s) || p.s[p.i] != '"' {
		return p.token(), true
	}
	p.i++
	var b []byte // earlier segments, when the string has escapes
	start := p.i
	for ; p.i < len(p.s); p.i++ {
		switch p.s[p.i] {
		case '\\':
			if p.i+1 >= len(p.s) {
				return "", false
			}
			b = append(b, p.s[start:p.i]...)
			p.i++ // the escaped byte starts the next segment
			start = p.i
		case '"':
			out := p.s[start:p.i]
			p.i++
			if b != nil {
				out = string(append(b, out...))
			}
			return out, true
		}
	}
	return "", false // unterminated
}

func (p *stParser) token() string {
	start := p.i
	for p.i < len(p.s) && isTChar(p.s[p.i]) {
		p.i++
	}
	return p.s[start:p.i]
}

func (p *stParser) skipOWS() {
	for p.i < len(p.s) && isOWS(p.s[p.i]) {
		p.i++
	}
}

// skipEntry moves to the next comma outside a quoted string.
func (p *stParser) skipEntry() {
	quoted := false
	for ; p.i < len(p.s); p.i++ {
		switch c := p.s[p.i]; {
		case quoted && c == '\\':
			p.i++
		case c == '"':
			quoted = !quoted
		case c == ',' && !quoted:
			return
		}
	}
}

func isOWS(c byte) bool { return c == ' ' || c == '\t' }

func isTChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
