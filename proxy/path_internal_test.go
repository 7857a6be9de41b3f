package proxy

import (
	"net/url"
	"path"
	"strings"
	"testing"
)

// FuzzCheckPath: a path checkPath accepts is already clean (path.Clean
// leaves it alone, bar a trailing slash), has no encoded separator, and
// re-parses from its escaped form to the same decoded path, so the path a
// route matched is the path the backend gets.
func FuzzCheckPath(f *testing.F) {
	for _, s := range []string{"/v1/chat/completions", "/sse/../v1/x", "/a/%2e%2e/b", "/a%2fb", "//x", "/a/./b",
		"/a\\b", "/", "/v1/", "/%00", "/a;b/..;/c", "/%252e%252e/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := url.ParseRequestURI(raw)
		if err != nil || checkPath(u) != nil {
			return
		}
		p := u.Path
		clean := path.Clean(p)
		if strings.HasSuffix(p, "/") && p != "/" {
			clean += "/"
		}
		if clean != p {
			t.Fatalf("accepted %q (decoded %q); path.Clean gives %q", raw, p, clean)
		}
		if containsFold(u.EscapedPath(), "%2f") || strings.ContainsRune(p, '\\') {
			t.Fatalf("accepted %q with an encoded or back slash", raw)
		}
		back, err := url.Parse(u.EscapedPath())
		if err != nil || back.Path != p {
			t.Fatalf("accepted %q: forwarded form %q parses to %q (%v)", raw, u.EscapedPath(), back.Path, err)
		}
	})
}

func TestCheckPathAllocs(t *testing.T) {
	u, _ := url.ParseRequestURI("/v1/chat/completions")
	if n := testing.AllocsPerRun(100, func() { _ = checkPath(u) }); n != 0 {
		t.Fatalf("checkPath allocates %v times; want 0", n)
	}
}
