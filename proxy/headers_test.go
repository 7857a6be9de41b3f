package proxy_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/limiter"
)

// TestHeaderPolicyBackendCannotForgeLimits: a backend's RateLimit,
// RateLimit-Policy and x-ratelimit-* fields (vLLM and TGI send none; an
// OpenAI-compatible upstream such as another gateway does) must not
// overwrite the tenant's own, and a backend's Set-Cookie must not be set
// on the edge's origin, shared by all tenants.
func TestHeaderPolicyBackendCannotForgeLimits(t *testing.T) {
	be := &recordingBackend{body: "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n",
		hdr: http.Header{
			"Ratelimit":                    {`"requests";r=999999;t=0`},
			"Ratelimit-Policy":             {`"requests";q=999999;w=60`},
			"X-Ratelimit-Remaining-Tokens": {"999999"},
			"X-Ratelimit-Limit-Requests":   {"999999"},
			"Retry-After-Ms":               {"1"},
			"Set-Cookie":                   {"session=backend; Path=/"},
			"X-Backend-Info":               {"kept"},
		}}
	srv := httptest.NewServer(be)
	defer srv.Close()
	e := startEdge(t, edgeOpts{pool: poolOf(srv.URL), limiter: limiter.NewLocal(1),
		limits: limiter.Limits{RequestsPerMinute: 10, TokensPerMinute: 10000}})
	resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("got %d; want 200", resp.StatusCode)
	}
	for _, k := range []string{"Ratelimit", "Ratelimit-Policy", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Limit-Requests"} {
		for _, v := range resp.Header.Values(k) {
			if regexp.MustCompile("999999").MatchString(v) {
				t.Errorf("%s: got %q; the backend's value replaced Sluice's", k, resp.Header.Values(k))
			}
		}
	}
	if got := resp.Header.Get("X-Ratelimit-Limit-Requests"); got != "10" {
		t.Errorf("X-Ratelimit-Limit-Requests: got %q; want Sluice's 10", got)
	}
	for k, want := range map[string]string{"Set-Cookie": "", "Retry-After-Ms": "", "X-Backend-Info": "kept"} {
		if got := resp.Header.Get(k); got != want {
			t.Errorf("%s: got %q; want %q", k, got, want)
		}
	}
}

// TestHeaderPolicyClientCannotSpoofBackend: headers backends and their
// frameworks trust for the client's address, the URL or the method never
// pass from a client; a client's request id is kept only if it is a strict
// token, and Sluice's own id always travels beside it.
func TestHeaderPolicyClientCannotSpoofBackend(t *testing.T) {
	be := &recordingBackend{body: "data: [DONE]\n\n"}
	srv := httptest.NewServer(be)
	defer srv.Close()
	e := startEdge(t, edgeOpts{pool: poolOf(srv.URL)})
	spoofed := []string{"X-Original-URL", "X-Rewrite-URL", "True-Client-IP", "X-Client-IP", "X-Forwarded-Port",
		"X-Forwarded-Prefix", "X-Cluster-Client-IP", "CF-Connecting-IP", "X-HTTP-Method-Override", "X-Real-IP"}
	var hdr []string
	for _, k := range spoofed {
		hdr = append(hdr, k, "/admin")
	}
	resp := post(t, h2cClient(), e.http+"/v1/chat/completions", chatBody(""), append(hdr, "X-Request-Id", "abc\tdef")...)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	got := be.last()
	for _, k := range spoofed {
		if v := got.Header.Get(k); v != "" {
			t.Errorf("backend got %s: %q; want it dropped", k, v)
		}
	}
	hex32 := regexp.MustCompile(`^[0-9a-f]{32}$`)
	if id := got.Header.Get("X-Request-Id"); !hex32.MatchString(id) {
		t.Errorf("backend X-Request-Id %q; want a generated id for a client id with a tab", id)
	}
	// Printable but outside the strict set: replaced.
	for _, bad := range []string{"a b", `x","tenant":"t2`, "id/../x", strings.Repeat("a", 65)} {
		resp = post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""), "X-Request-Id", bad)
		resp.Body.Close()
		if id := be.last().Header.Get("X-Request-Id"); id == bad || !hex32.MatchString(id) {
			t.Errorf("client id %q: backend got %q; want a generated id", bad, id)
		}
	}
	// A strict client id is kept, and Sluice's own id goes beside it both ways.
	resp = post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""), "X-Request-Id", "req_01:abc-9.x",
		"X-Sluice-Request-Id", "forged")
	resp.Body.Close()
	got = be.last()
	own := got.Header.Get("X-Sluice-Request-Id")
	if got.Header.Get("X-Request-Id") != "req_01:abc-9.x" || !hex32.MatchString(own) ||
		resp.Header.Get("X-Sluice-Request-Id") != own || resp.Header.Get("X-Request-Id") != "req_01:abc-9.x" {
		t.Errorf("backend ids %q / %q, response %q / %q; want the client's id kept and Sluice's own beside it",
			got.Header.Get("X-Request-Id"), own, resp.Header.Get("X-Request-Id"), resp.Header.Get("X-Sluice-Request-Id"))
	}
}

// TestHeaderPolicyBackendCannotDropSluiceFields: the fields a backend's
// Connection header names are hop-by-hop for the backend's message: they
// are not copied, but Sluice's own fields of the same names (its request
// id, the tenant's rate-limit fields, the region) stay.
func TestHeaderPolicyBackendCannotDropSluiceFields(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		h := w.Header()
		h["Connection"] = []string{"keep-alive, X-Request-Id, Ratelimit", "X-Ratelimit-Limit-Requests, X-Sluice-Request-Id, X-Hop"}
		h.Set("X-Hop", "dropped")
		h.Set("X-Backend-Info", "kept")
		h.Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	e := startEdge(t, edgeOpts{pool: poolOf(srv.URL), limiter: limiter.NewLocal(1),
		limits: limiter.Limits{RequestsPerMinute: 10, TokensPerMinute: 10000}})
	for _, stream := range []bool{true, false} {
		body := chatBody("")
		if !stream {
			body = strings.Replace(body, `"stream":true`, `"stream":false`, 1)
		}
		resp := post(t, h1Client(), e.http+"/v1/chat/completions", body)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stream %v: got %d; want 200", stream, resp.StatusCode)
		}
		for _, k := range []string{"X-Request-Id", "X-Sluice-Request-Id", "Ratelimit", "X-Ratelimit-Limit-Requests"} {
			if resp.Header.Get(k) == "" {
				t.Errorf("stream %v: %s missing: the backend's Connection header removed Sluice's own field", stream, k)
			}
		}
		for k, want := range map[string]string{"X-Hop": "", "X-Backend-Info": "kept"} {
			if got := resp.Header.Get(k); got != want {
				t.Errorf("stream %v: %s: got %q; want %q", stream, k, got, want)
			}
		}
	}
}
