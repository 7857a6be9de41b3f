package node

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// adminDo sends one request to the admin listener with the given Host
// (empty: the listener's address) and headers, and returns the status and
// body.
func adminDo(t *testing.T, method, url, host string, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A web page in an operator's browser cannot make the node reload: a
// cross-site POST (fetch or form, old browser without Sec-Fetch-Site
// included) is refused before the handler runs; curl's POST still works.
func TestAttackAdminCSRFReload(t *testing.T) {
	tn := startFileNode(t, nodeConfig{}.String())
	for _, tc := range []struct {
		name string
		hdr  map[string]string
	}{
		{"fetch from another site", map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}},
		{"form from a sibling site", map[string]string{"Origin": "http://x.localhost:9090", "Sec-Fetch-Site": "same-site", "Content-Type": "application/x-www-form-urlencoded"}},
		{"old browser, Origin only", map[string]string{"Origin": "https://evil.example", "Content-Type": "text/plain"}},
		{"sandboxed page", map[string]string{"Origin": "null"}},
	} {
		code, body := adminDo(t, http.MethodPost, tn.admin+"/-/reload", "", tc.hdr)
		if code != http.StatusForbidden {
			t.Errorf("%s: POST /-/reload %d %s; want 403", tc.name, code, body)
		}
	}
	if got := tn.debugConfig().Attempts; got != 0 {
		t.Fatalf("reload attempts after refused requests: %d; want 0", got)
	}
	// A cross-site GET (an <img> or <script> tag) is refused too.
	if code, _ := adminDo(t, http.MethodGet, tn.admin+"/debug/pprof/", "", map[string]string{"Sec-Fetch-Site": "cross-site"}); code != http.StatusForbidden {
		t.Errorf("cross-site GET: %d; want 403", code)
	}
	// The same origin and non-browser clients are served.
	if code, body := adminDo(t, http.MethodPost, tn.admin+"/-/reload", "", map[string]string{"Origin": tn.admin, "Sec-Fetch-Site": "same-origin"}); code != http.StatusOK {
		t.Errorf("same-origin POST: %d %s; want 200", code, body)
	}
	if code, body := adminDo(t, http.MethodPost, tn.admin+"/-/reload", "", nil); code != http.StatusOK {
		t.Errorf("curl POST: %d %s; want 200", code, body)
	}
}

// DNS rebinding: a page on evil.example whose name now resolves to the
// admin address sends Host: evil.example; it reads nothing, not even
// metrics. IP literals, localhost and admin.hosts are served.
func TestAttackAdminDNSRebinding(t *testing.T) {
	tn := startFileNode(t, nodeConfig{}.String()+"admin:\n  hosts: [sluice-admin.internal]\n")
	for _, path := range []string{"/debug/config?format=yaml", "/debug/stats", "/", "/metrics", "/healthz"} {
		code, body := adminDo(t, http.MethodGet, tn.admin+path, "evil.example:9090", nil)
		if code != http.StatusMisdirectedRequest {
			t.Errorf("GET %s with Host evil.example: %d; want 421", path, code)
		}
		if strings.Contains(body, "sluice") && strings.Contains(body, "pools") {
			t.Errorf("GET %s with Host evil.example shows the config:\n%s", path, body)
		}
	}
	for _, host := range []string{"", "localhost:1234", "LOCALHOST", "127.0.0.1", "[::1]:9090", "sluice-admin.internal:9090", "Sluice-Admin.Internal."} {
		if code, body := adminDo(t, http.MethodGet, tn.admin+"/debug/config", host, nil); code != http.StatusOK {
			t.Errorf("GET /debug/config with Host %q: %d %s; want 200", host, code, body)
		}
	}
}

// With admin.token_file, everything but health and metrics needs the
// token; a wrong one (or another scheme) is refused with 401.
func TestAttackAdminWithoutToken(t *testing.T) {
	const token = "adm-0123456789abcdef"
	tn := startFileNode(t, nodeConfig{}.String()+"admin:\n  token_file: admin.token\n", "admin.token", token+"\n")
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		if code, _ := adminDo(t, http.MethodGet, tn.admin+path, "", nil); code != http.StatusOK {
			t.Errorf("GET %s without token: %d; want 200 (open)", path, code)
		}
	}
	for _, auth := range []string{"", "Bearer wrong", "Basic " + token, "Bearer " + token + "x", "Bearer"} {
		h := map[string]string{}
		if auth != "" {
			h["Authorization"] = auth
		}
		for _, path := range []string{"/debug/config?format=yaml", "/debug/config?format=tenants", "/debug/stats", "/"} {
			if code, _ := adminDo(t, http.MethodGet, tn.admin+path, "", h); code != http.StatusUnauthorized {
				t.Errorf("GET %s with Authorization %q: %d; want 401", path, auth, code)
			}
		}
		if code, _ := adminDo(t, http.MethodPost, tn.admin+"/-/reload", "", h); code != http.StatusUnauthorized {
			t.Errorf("POST /-/reload with Authorization %q: %d; want 401", auth, code)
		}
	}
	if got := tn.n.status.attempts; got != 0 {
		t.Fatalf("reload attempts without the token: %d; want 0", got)
	}
	ok := map[string]string{"Authorization": "Bearer " + token}
	if code, body := adminDo(t, http.MethodGet, tn.admin+"/debug/config?format=yaml", "", ok); code != http.StatusOK || !strings.Contains(body, "routes") {
		t.Errorf("GET /debug/config with the token: %d %s", code, body)
	}
	if code, body := adminDo(t, http.MethodPost, tn.admin+"/-/reload", "", ok); code != http.StatusOK {
		t.Errorf("POST /-/reload with the token: %d %s", code, body)
	}
	// A rotated token file takes effect at once; the old token stops working.
	tn.write("admin.token", "adm-rotated\n")
	if code, _ := adminDo(t, http.MethodGet, tn.admin+"/debug/stats", "", ok); code != http.StatusUnauthorized {
		t.Errorf("old token after rotation: %d; want 401", code)
	}
	if code, _ := adminDo(t, http.MethodGet, tn.admin+"/debug/stats", "", map[string]string{"Authorization": "Bearer adm-rotated"}); code != http.StatusOK {
		t.Errorf("new token after rotation: %d; want 200", code)
	}
}

// The shown config and tenants file carry no secret, comment or URL user
// info, through the real admin listener (issue 16 item 12).
func TestAttackAdminConfigShowsSecrets(t *testing.T) {
	cfg := "# the pool key used to be sk-old-in-comment\n" + nodeConfig{
		Pools: "  - name: p\n    api_key: |\n      sk-block-secret\n    backends: [{url: \"sim://gpu-a\"}]\n" +
			"  - name: q\n    api_key: >\n      sk-folded-secret\n    backends: [{url: \"http://user:url-secret@127.0.0.1:1\"}]\n",
		Routes: "  - {name: main, path: /v1/, models: [sim-small], pool: p}\n  - {name: q, path: /q/, pool: q}\n",
	}.String()
	tn := startFileNode(t, cfg)
	for _, path := range []string{"/debug/config?format=yaml", "/debug/stats", "/"} {
		body := tn.get(tn.admin + path)
		for _, s := range []string{"sk-old-in-comment", "sk-block-secret", "sk-folded-secret", "url-secret", "user:"} {
			if strings.Contains(body, s) {
				t.Errorf("GET %s shows %q:\n%s", path, s, body)
			}
		}
	}
	if body := tn.get(tn.admin + "/debug/stats"); !strings.Contains(body, "http://127.0.0.1:1") {
		t.Errorf("/debug/stats lost the backend URL:\n%s", body)
	}
}

// A reload to a config whose admin.token_file cannot be read is refused
// whole: the node keeps its config and token, and is not locked out.
func TestAdminTokenFileReloadRefused(t *testing.T) {
	cfg := nodeConfig{}.String()
	tn := startFileNode(t, cfg+"admin:\n  token_file: admin.token\n", "admin.token", "adm-one\n")
	tn.write("sluice.yaml", cfg+"admin:\n  token_file: missing.token\n")
	ok := map[string]string{"Authorization": "Bearer adm-one"}
	if code, body := adminDo(t, http.MethodPost, tn.admin+"/-/reload", "", ok); code != http.StatusUnprocessableEntity || !strings.Contains(body, "admin.token_file") {
		t.Fatalf("reload to a missing token file: %d %s; want 422 naming admin.token_file", code, body)
	}
	if code, _ := adminDo(t, http.MethodGet, tn.admin+"/debug/stats", "", ok); code != http.StatusOK {
		t.Fatalf("the old token after the refused reload: %d; want 200", code)
	}
}
