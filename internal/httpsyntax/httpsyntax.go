// Package httpsyntax holds the byte classes of HTTP/1.1's message syntax
// that Sluice's own parsers share (proxy/listen's request head,
// proxy/h1up's response fields).
package httpsyntax

// TokenByte: RFC 9110's tchar (a method or a field name byte).
var TokenByte = AlnumAnd("!#$%&'*+-.^_`|~")

// AlnumAnd is the byte class of ASCII letters and digits and the bytes
// of extra.
func AlnumAnd(extra string) (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for i := 0; i < len(extra); i++ {
		t[extra[i]] = true
	}
	return t
}

// ValueByte: a field value byte net/textproto accepts, and so Sluice's
// parsers (VCHAR, SP, HTAB, obs-text).
var ValueByte = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != 0x7f
	}
	t['\t'] = true
	return t
}()

// CanonField checks a field line whose name ends at colon (> 0): every
// name byte a token byte, every value byte a field value byte. It
// canonicalizes the name in place as net/textproto does (upper case
// first and after '-', lower case elsewhere) and reports false, having
// perhaps changed the name's case, when a byte is refused.
func CanonField(l []byte, colon int) bool {
	upper := true
	for i, c := range l[:colon] {
		if !TokenByte[c] {
			return false
		}
		if upper && 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		} else if !upper && 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		l[i] = c
		upper = c == '-'
	}
	for _, c := range l[colon+1:] {
		if !ValueByte[c] {
			return false
		}
	}
	return true
}
