package proxy

import (
	"net/http"
	"net/url"
	"strings"
)

// checkPath refuses a request path that is not in canonical form, so that
// the path routes match on is exactly the path the backend gets: a route
// for /sse/ must never carry /sse/../v1/chat/completions to a backend that
// resolves the dot segments (RFC 3986 section 5.2.4) and serves its chat
// endpoint without Sluice's accounting. Refused, with 400: an empty or
// relative path; a "." or ".." segment, written plainly or percent-encoded
// (%2e); an empty segment ("//"); an encoded slash or backslash (%2f,
// %5c), which a backend may decode into a separator Sluice did not match
// on; a backslash (some servers treat it as "/"); control characters and
// NUL. Sluice refuses rather than rewrites: a client that sends such a path
// is either broken or probing, and a rewrite would make the access log
// disagree with what the client asked for. It does not allocate.
func checkPath(u *url.URL) *APIError {
	p := u.Path
	if p == "" || p[0] != '/' {
		return badPath("the path must be absolute")
	}
	if raw := u.RawPath; raw != "" {
		// Path is the decoded form; RawPath (set only when the client's
		// escaping differs from the default) tells what was encoded.
		if containsFold(raw, "%2f") || containsFold(raw, "%5c") {
			return badPath("the path must not contain an encoded / or \\")
		}
	}
	start := 1
	for i := 1; i <= len(p); i++ {
		if i < len(p) {
			c := p[i]
			if c < ' ' || c == 0x7f || c == '\\' {
				return badPath("the path must not contain control characters or \\")
			}
			if c != '/' {
				continue
			}
		}
		switch seg := p[start:i]; {
		case seg == "." || seg == "..":
			return badPath("the path must not contain . or .. segments")
		case seg == "" && i < len(p):
			return badPath("the path must not contain empty segments (//)")
		}
		start = i + 1
	}
	return nil
}

func badPath(why string) *APIError {
	return &APIError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_path",
		Message: "invalid request path: " + why}
}

// containsFold reports whether s contains sub (ASCII, lower case) in any
// letter case. It does not allocate.
func containsFold(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if strings.EqualFold(s[i:i+len(sub)], sub) {
			return true
		}
	}
	return false
}
