// Package httpsyntax holds the byte classes of HTTP/1.1's message syntax
// that Sluice's own parsers share (proxy/listen's request head,
// proxy/h1up's response fields).
package httpsyntax

// TokenByte: RFC 9110's tchar (a method or a field name byte).
var TokenByte = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

// ValueByte: a field value byte net/textproto accepts, and so Sluice's
// parsers (VCHAR, SP, HTAB, obs-text).
var ValueByte = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != 0x7f
	}
	t['\t'] = true
	return t
}()
