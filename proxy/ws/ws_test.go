package ws

import (
	"net/http"
	"testing"
)

func TestCheckOrigin(t *testing.T) {
	cases := []struct {
		origin  string
		allowed []string
		ok      bool
	}{
		{"", nil, true},
		{"http://edge.example:8080", nil, true}, // same origin
		{"https://evil.example", nil, false},
		{"null", nil, false},
		{"https://app.example.com", []string{"https://app.example.com"}, true},
		{"https://APP.example.com", []string{"https://app.example.com"}, true},
		{"http://app.example.com", []string{"https://app.example.com"}, false},
		{"https://a.example.com", []string{"https://*.example.com"}, true},
		{"https://x.a.example.com", []string{"https://*.example.com"}, true},
		{"https://example.com", []string{"https://*.example.com"}, false},
		{"https://evilexample.com", []string{"https://*.example.com"}, false},
		{"https://anything", []string{"*"}, true},
	}
	for _, tc := range cases {
		r := &http.Request{Host: "edge.example:8080", Header: http.Header{}}
		if tc.origin != "" {
			r.Header.Set("Origin", tc.origin)
		}
		if got := CheckOrigin(r, tc.allowed) == nil; got != tc.ok {
			t.Errorf("origin %q allowed %v: ok=%v; want %v", tc.origin, tc.allowed, got, tc.ok)
		}
	}
	for s, want := range map[string]bool{
		"*": true, "https://a.b": true, "http://localhost:3000": true, "https://*.b.c": true, "https://a.b/": true,
		"a.b": false, "ftp://a.b": false, "https://a.b/x": false, "https://*": false, "https://a.*.c": false, "": false,
	} {
		if got := ValidOrigin(s); got != want {
			t.Errorf("ValidOrigin(%q) = %v; want %v", s, got, want)
		}
	}
}
