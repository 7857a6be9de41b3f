package configs

import (
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"
)

// RedactedText returns the config's text with its secrets (redis.password,
// pools[].api_key, tracing.headers values) replaced by Redacted, for showing the active config to
// operators. The result parses to the same config but for those values;
// Compare treats a Redacted value as unknown, not as a change.
func (c *Config) RedactedText() []byte {
	type secret struct {
		pos   Pos
		value string
	}
	var secrets []secret
	addSecret := func(path, value string) {
		if p, ok := c.pos[path]; ok && value != "" {
			secrets = append(secrets, secret{p, value})
		}
	}
	addSecret("redis.password", c.Redis.Password)
	for i, p := range c.Pools {
		addSecret(fmt.Sprintf("pools[%d].api_key", i), p.APIKey)
	}
	for k, v := range c.Tracing.Headers { // a collector's credentials
		addSecret("tracing.headers."+k, v)
	}
	// Replace from the end so earlier offsets stay valid.
	sort.Slice(secrets, func(i, j int) bool {
		a, b := secrets[i].pos, secrets[j].pos
		return a.Line > b.Line || (a.Line == b.Line && a.Col > b.Col)
	})
	text := string(c.Raw)
	for _, s := range secrets {
		text = redactAt(text, s.pos, s.value)
	}
	return []byte(text)
}

// redactAt replaces the scalar value written at pos (a rune column). When
// the value is not written there literally (escapes, a block scalar), the
// rest of the line is replaced.
func redactAt(text string, pos Pos, value string) string {
	start := 0
	for line := 1; line < pos.Line; line++ {
		i := strings.IndexByte(text[start:], '\n')
		if i < 0 {
			return text
		}
		start += i + 1
	}
	end := strings.IndexByte(text[start:], '\n')
	if end < 0 {
		end = len(text) - start
	}
	lineText := text[start : start+end]
	off := 0
	for col := 1; col < pos.Col && off < len(lineText); col++ {
		_, size := utf8.DecodeRuneInString(lineText[off:])
		off += size
	}
	rest := lineText[off:]
	q := ""
	if rest != "" && (rest[0] == '"' || rest[0] == '\'') {
		q, rest = rest[:1], rest[1:]
	}
	if strings.HasPrefix(rest, value) && (q == "" || strings.HasPrefix(rest[len(value):], q)) {
		at := start + off + len(q)
		return text[:at] + Redacted + text[at+len(value):]
	}
	return text[:start+off] + `"` + Redacted + `"` + text[start+end:]
}
