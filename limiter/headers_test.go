package limiter

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// sfItem is one member of a Structured Field List (RFC 8941): a bare item
// and its parameters in order.
type sfItem struct {
	value  any // string (sf-string), sfToken, int64, bool
	params []sfParam
}

type sfParam struct {
	key   string
	value any
}

type sfToken string

// parseSFList is a strict RFC 8941 List parser for lists of items (no
// inner lists, decimals or byte sequences, which the fields here never use).
func parseSFList(s string) ([]sfItem, error) {
	p := &sfParser{s: strings.TrimLeft(s, " ")}
	var out []sfItem
	for {
		it, err := p.item()
		if err != nil {
			return nil, err
		}
		out = append(out, it)
		p.ows()
		if p.eof() {
			return out, nil
		}
		if p.next() != ',' {
			return nil, fmt.Errorf("at %d: want ',' between members", p.i-1)
		}
		p.ows()
		if p.eof() {
			return nil, fmt.Errorf("trailing comma")
		}
	}
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) eof() bool  { return p.i >= len(p.s) }
func (p *sfParser) peek() byte { return p.s[p.i] }
func (p *sfParser) next() byte { c := p.s[p.i]; p.i++; return c }
func (p *sfParser) ows() {
	for !p.eof() && (p.peek() == ' ' || p.peek() == '\t') {
		p.i++
	}
}

func (p *sfParser) item() (sfItem, error) {
	v, err := p.bare()
	if err != nil {
		return sfItem{}, err
	}
	it := sfItem{value: v}
	for !p.eof() && p.peek() == ';' {
		p.i++
		for !p.eof() && p.peek() == ' ' {
			p.i++
		}
		k, err := p.key()
		if err != nil {
			return sfItem{}, err
		}
		var pv any = true
		if !p.eof() && p.peek() == '=' {
			p.i++
			if pv, err = p.bare(); err != nil {
				return sfItem{}, err
			}
		}
		it.params = append(it.params, sfParam{k, pv})
	}
	return it, nil
}

func (p *sfParser) key() (string, error) {
	start := p.i
	if p.eof() || !(p.peek() >= 'a' && p.peek() <= 'z' || p.peek() == '*') {
		return "", fmt.Errorf("at %d: key must start with lcalpha or '*'", p.i)
	}
	for !p.eof() && strings.IndexByte("abcdefghijklmnopqrstuvwxyz0123456789_-.*", p.peek()) >= 0 {
		p.i++
	}
	return p.s[start:p.i], nil
}

func (p *sfParser) bare() (any, error) {
	if p.eof() {
		return nil, fmt.Errorf("at %d: want an item", p.i)
	}
	switch c := p.peek(); {
	case c == '"':
		return p.str()
	case c == '-' || c >= '0' && c <= '9':
		return p.integer()
	case c == '?':
		p.i++
		if p.eof() || (p.peek() != '0' && p.peek() != '1') {
			return nil, fmt.Errorf("at %d: bad boolean", p.i)
		}
		return p.next() == '1', nil
	case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '*':
		start := p.i
		for !p.eof() && (strings.IndexByte("!#$%&'*+-.^_`|~:/", p.peek()) >= 0 ||
			p.peek() >= '0' && p.peek() <= '9' || p.peek() >= 'a' && p.peek() <= 'z' || p.peek() >= 'A' && p.peek() <= 'Z') {
			p.i++
		}
		return sfToken(p.s[start:p.i]), nil
	}
	return nil, fmt.Errorf("at %d: unexpected %q", p.i, p.peek())
}

func (p *sfParser) str() (string, error) {
	p.i++ // opening quote
	var b strings.Builder
	for !p.eof() {
		c := p.next()
		switch {
		case c == '\\':
			if p.eof() || (p.peek() != '"' && p.peek() != '\\') {
				return "", fmt.Errorf("at %d: bad escape", p.i)
			}
			b.WriteByte(p.next())
		case c == '"':
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("at %d: byte %#x not allowed in a string", p.i-1, c)
		default:
			b.WriteByte(c)
		}
	}
	return "", fmt.Errorf("unterminated string")
}

func (p *sfParser) integer() (int64, error) {
	start := p.i
	if p.peek() == '-' {
		p.i++
	}
	digits := p.i
	for !p.eof() && p.peek() >= '0' && p.peek() <= '9' {
		p.i++
	}
	if p.i == digits || p.i-digits > 15 {
		return 0, fmt.Errorf("at %d: integer must have 1 to 15 digits", start)
	}
	if !p.eof() && p.peek() == '.' {
		return 0, fmt.Errorf("at %d: decimals not expected", p.i)
	}
	return strconv.ParseInt(p.s[start:p.i], 10, 64)
}

func TestSFParserRejects(t *testing.T) {
	for _, bad := range []string{`"a";q=1,`, `"a";Q=1`, `"a";q=1.5`, `"a" "b"`, `"a`, `"a\x";q=1`, `"a";q=1234567890123456`, `"é"`} {
		if _, err := parseSFList(bad); err == nil {
			t.Errorf("parseSFList(%q) accepted invalid input", bad)
		}
	}
}

func params(it sfItem) map[string]any {
	m := map[string]any{}
	for _, p := range it.params {
		m[p.key] = p.value
	}
	return m
}

func TestSetHeaders(t *testing.T) {
	d := Decision{
		Requests:    Quota{Limit: 120, Remaining: 119, Reset: 500 * time.Millisecond},
		Tokens:      Quota{Limit: 20000, Remaining: 19744, Reset: 6 * time.Minute},
		Concurrency: Quota{Limit: 8, Remaining: 7},
		Allowed:     true,
	}
	h := http.Header{}
	SetHeaders(h, d)
	policy, err := parseSFList(h.Get("RateLimit-Policy"))
	if err != nil {
		t.Fatalf("RateLimit-Policy %q: %v", h.Get("RateLimit-Policy"), err)
	}
	rl, err := parseSFList(h.Get("RateLimit"))
	if err != nil {
		t.Fatalf("RateLimit %q: %v", h.Get("RateLimit"), err)
	}
	if len(policy) != 3 || len(rl) != 3 {
		t.Fatalf("policies %d, ratelimit items %d; want 3 each", len(policy), len(rl))
	}
	wantPolicy := []struct {
		name string
		q    int64
		w    any
		qu   any
	}{{"requests", 120, int64(60), nil}, {"tokens", 20000, int64(60), "tokens"}, {"concurrency", 8, nil, "concurrency"}}
	for i, w := range wantPolicy {
		ps := params(policy[i])
		if policy[i].value != w.name || ps["q"] != w.q || ps["w"] != w.w || ps["qu"] != w.qu {
			t.Errorf("policy %d = %v %v; want %q q=%d w=%v qu=%v", i, policy[i].value, ps, w.name, w.q, w.w, w.qu)
		}
	}
	wantRL := []struct {
		name string
		r    int64
		t    any
	}{{"requests", 119, int64(1)}, {"tokens", 19744, int64(360)}, {"concurrency", 7, nil}}
	for i, w := range wantRL {
		ps := params(rl[i])
		if rl[i].value != w.name || ps["r"] != w.r || ps["t"] != w.t {
			t.Errorf("RateLimit %d = %v %v; want %q r=%d t=%v", i, rl[i].value, ps, w.name, w.r, w.t)
		}
	}
	for k, want := range map[string]string{
		"x-ratelimit-limit-requests": "120", "x-ratelimit-remaining-requests": "119",
		"x-ratelimit-reset-requests": "500ms", "x-ratelimit-limit-tokens": "20000",
		"x-ratelimit-remaining-tokens": "19744", "x-ratelimit-reset-tokens": "6m0s",
	} {
		if got := h.Get(k); got != want {
			t.Errorf("%s = %q; want %q", k, got, want)
		}
	}
	for _, k := range []string{"x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"} {
		if _, err := time.ParseDuration(h.Get(k)); err != nil {
			t.Errorf("%s = %q does not parse with time.ParseDuration: %v", k, h.Get(k), err)
		}
	}
	if h.Get("Retry-After") != "" {
		t.Errorf("Retry-After %q on an admitted request", h.Get("Retry-After"))
	}
}

func TestSetHeadersRefusal(t *testing.T) {
	for _, c := range []struct {
		retry       time.Duration
		after, afMS string
	}{
		{1200 * time.Millisecond, "2", "1200"},
		{3 * time.Second, "3", "3000"},
		{10 * time.Microsecond, "1", "1"},
		{0, "1", "1"},
	} {
		h := http.Header{}
		d := Decision{Reason: ReasonTokens, RetryAfter: c.retry,
			Tokens: Quota{Limit: 1000, Remaining: 0, Reset: 59*time.Second + 400*time.Millisecond}}
		SetHeaders(h, d)
		if h.Get("Retry-After") != c.after || h.Get("retry-after-ms") != c.afMS {
			t.Errorf("retry %v: Retry-After %q retry-after-ms %q; want %q %q", c.retry,
				h.Get("Retry-After"), h.Get("retry-after-ms"), c.after, c.afMS)
		}
		if got := h.Get("x-ratelimit-reset-tokens"); got != "59.4s" {
			t.Errorf("x-ratelimit-reset-tokens = %q; want 59.4s", got)
		}
		if _, err := parseSFList(h.Get("RateLimit")); err != nil {
			t.Errorf("RateLimit %q: %v", h.Get("RateLimit"), err)
		}
	}
	h := http.Header{}
	SetHeaders(h, Decision{Allowed: true})
	if len(h) != 0 {
		t.Errorf("headers %v for a tenant without limits; want none", h)
	}
}

func TestErrorBody(t *testing.T) {
	cases := []struct {
		d          Decision
		status     int
		typ, code  string
		msgHas     []string
		limitField string
	}{
		{Decision{Reason: ReasonTokens, RetryAfter: 1500 * time.Millisecond, Tokens: Quota{Limit: 20000}},
			429, "rate_limit_exceeded", "rate_limit_exceeded", []string{"tokens per minute", "20000", "1.5s"}, "tokens"},
		{Decision{Reason: ReasonRequests, RetryAfter: 20 * time.Second, Requests: Quota{Limit: 120}},
			429, "rate_limit_exceeded", "rate_limit_exceeded", []string{"requests per minute", "20s"}, "requests"},
		{Decision{Reason: ReasonConcurrency, RetryAfter: time.Second, Concurrency: Quota{Limit: 8}},
			429, "rate_limit_exceeded", "rate_limit_exceeded", []string{"concurrent", "8"}, "concurrency"},
		{Decision{Reason: ReasonStore, RetryAfter: time.Second, Degraded: true},
			503, "server_error", "rate_limiter_unavailable", []string{"unavailable", "1s"}, "store"},
	}
	for _, c := range cases {
		var body struct {
			Error struct {
				Message      string  `json:"message"`
				Type         string  `json:"type"`
				Param        *string `json:"param"`
				Code         string  `json:"code"`
				Limit        string  `json:"limit"`
				RetryAfterMS int64   `json:"retry_after_ms"`
			} `json:"error"`
		}
		raw := ErrorBody(c.d)
		if err := json.Unmarshal(raw, &body); err != nil {
			t.Fatalf("ErrorBody %s: %v", raw, err)
		}
		e := body.Error
		if e.Type != c.typ || e.Code != c.code || e.Limit != c.limitField || e.Param != nil ||
			e.RetryAfterMS != c.d.RetryAfter.Milliseconds() {
			t.Errorf("ErrorBody = %s; want type %q code %q limit %q", raw, c.typ, c.code, c.limitField)
		}
		for _, s := range c.msgHas {
			if !strings.Contains(e.Message, s) {
				t.Errorf("message %q lacks %q", e.Message, s)
			}
		}
		if got := StatusCode(c.d); got != c.status {
			t.Errorf("StatusCode = %d; want %d", got, c.status)
		}
	}
	if ErrorBody(Decision{Allowed: true}) != nil {
		t.Error("ErrorBody of an allowed decision is not nil")
	}
}

// TestHeadersFromLimiter checks the fields produced from a real decision.
func TestHeadersFromLimiter(t *testing.T) {
	l := NewLocal(1)
	lim := Limits{MaxConcurrency: 2, TokensPerMinute: 1000, RequestsPerMinute: 60}
	var last Decision
	now := time.Now() // one instant: the token count must not refill meanwhile
	for i := 0; i < 4; i++ {
		last = l.AdmitAt(now, Request{ID: nextID(), Tenant: "h", Limits: lim, InputTokens: 100, OutputTokens: 100})
	}
	h := http.Header{}
	SetHeaders(h, last)
	if last.Allowed {
		t.Fatal("4th admission allowed with max_concurrency 2")
	}
	for _, k := range []string{"RateLimit-Policy", "RateLimit"} {
		if _, err := parseSFList(h.Get(k)); err != nil {
			t.Errorf("%s %q: %v", k, h.Get(k), err)
		}
	}
	if h.Get("Retry-After") != "1" || h.Get("x-ratelimit-remaining-tokens") != "600" {
		t.Errorf("headers %v; want Retry-After 1 and 600 tokens remaining", h)
	}
}

// BenchmarkSetHeaders writes the headers of an allowed request with
// request, token and concurrency limits.
//
//	go test -run '^$' -bench BenchmarkSetHeaders -benchmem ./limiter/
func BenchmarkSetHeaders(b *testing.B) {
	d := Decision{Allowed: true,
		Requests:    Quota{Limit: 600, Remaining: 599, Reset: 100 * time.Millisecond},
		Tokens:      Quota{Limit: 100000, Remaining: 99000, Reset: 600 * time.Millisecond},
		Concurrency: Quota{Limit: 8, Remaining: 7}}
	b.ReportAllocs()
	for b.Loop() {
		SetHeaders(make(http.Header, 8), d)
	}
}

// TestAppendReset checks the allocation-free reset formatting against
// time.Duration.String (what resetString returns) from 0 to past an hour,
// including the roundings up to whole milliseconds.
func TestAppendReset(t *testing.T) {
	check := func(d time.Duration) {
		t.Helper()
		if got, want := string(appendReset(nil, d)), resetString(d); got != want {
			t.Fatalf("appendReset(%v) = %q, want %q", int64(d), got, want)
		}
	}
	for _, d := range []time.Duration{-time.Second, 0, 1, time.Millisecond - 1, time.Millisecond, 999 * time.Millisecond,
		time.Second, 1500 * time.Millisecond, 1050 * time.Millisecond, 1005 * time.Millisecond, time.Minute,
		6 * time.Minute, 61*time.Second + 250*time.Millisecond, time.Hour, time.Hour + time.Millisecond,
		25*time.Hour + 59*time.Minute + 59*time.Second + 999*time.Millisecond + 1} {
		check(d)
	}
	for ms := int64(0); ms < 3*3600*1000; ms += 997 {
		check(time.Duration(ms)*time.Millisecond + 3)
	}
}

// TestSetHeadersAllocs bounds SetHeaders' allocations for an allowed
// decision with every limit: one allocation holds all the values' bytes
// and their slices.
func TestSetHeadersAllocs(t *testing.T) {
	d := Decision{Allowed: true,
		Requests:     Quota{Limit: 600, Remaining: 599, Reset: 100 * time.Millisecond},
		Tokens:       Quota{Limit: 100000, Remaining: 99000, Reset: 600 * time.Millisecond},
		InputTokens:  Quota{Limit: 50000, Remaining: 1, Reset: 61 * time.Second},
		OutputTokens: Quota{Limit: 50000, Remaining: -3, Reset: time.Hour},
		Concurrency:  Quota{Limit: 8, Remaining: 7}}
	h := make(http.Header, 16)
	if n := testing.AllocsPerRun(100, func() { clear(h); SetHeaders(h, d) }); n > 1 {
		t.Errorf("SetHeaders: %v allocations, want at most 1", n)
	}
	if got := h.Get("X-Ratelimit-Reset-Tokens"); got != "600ms" {
		t.Errorf("x-ratelimit-reset-tokens %q, want 600ms", got)
	}
	if got := h.Get("RateLimit"); !strings.Contains(got, `"output_tokens";r=0;t=3600`) {
		t.Errorf("RateLimit %q: want output_tokens r=0 t=3600", got)
	}
}
