package configs

import (
	"strings"
	"testing"
	"time"
)

func TestACMEConfig(t *testing.T) {
	y := `listeners:
  http: 127.0.0.1:8080
  https:
    addr: 127.0.0.1:8443
    acme:
      email: ops@example.com
      domains: [edge.example.com, Edge2.example.com]
      ca: https://acme-staging-v02.api.letsencrypt.org/directory
      storage: /var/lib/sluice/acme
      challenges: [tls-alpn-01, http-01]
      profile: shortlived
      renew_window_ratio: 0.5
      check_interval: 1m
      disable_ocsp_stapling: true
` + strings.TrimPrefix(valid, "listeners:\n  http: 127.0.0.1:8080\n")
	c, err := Parse("acme.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	a := c.Listeners.HTTPS.ACME
	if a == nil || a.Email != "ops@example.com" || len(a.Domains) != 2 || a.Storage != "/var/lib/sluice/acme" ||
		len(a.Challenges) != 2 || a.Profile != "shortlived" || a.RenewWindowRatio != 0.5 ||
		a.CheckInterval != time.Minute || !a.DisableOCSPStapling {
		t.Fatalf("decoded acme %+v", a)
	}
	d, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	if d.Listeners.HTTPS != nil && d.Listeners.HTTPS.ACME != nil {
		t.Fatal("the embedded default turns ACME on; want it off")
	}
}

// Each bad https.acme value is reported at its own line and column.
func TestACMEConfigErrors(t *testing.T) {
	rest := strings.TrimPrefix(valid, "listeners:\n  http: 127.0.0.1:8080\n")
	head := "listeners:\n  https:\n    addr: 127.0.0.1:8443\n    acme:\n"
	ok := "      domains: [edge.example.com]\n      storage: /tmp/acme\n"
	wantErrors(t, head+"      storage: /tmp/acme\n"+rest, `5:7: listeners.https.acme.domains: at least one name is required`)
	wantErrors(t, head+"      domains: [edge.example.com, '*.example.com']\n      storage: /tmp/acme\n"+rest,
		`5:35: listeners.https.acme.domains[1] "*.example.com": want a DNS name`)
	wantErrors(t, head+"      domains: [127.0.0.1]\n      storage: /tmp/acme\n"+rest,
		`5:17: listeners.https.acme.domains[0] "127.0.0.1": want a DNS name`)
	wantErrors(t, head+"      domains: [edge.example.com]\n"+rest, `5:7: listeners.https.acme.storage: a directory is required`)
	wantErrors(t, head+ok+"      challenges: [dns-01]\n"+rest, `7:20: listeners.https.acme.challenges[0] "dns-01": want "tls-alpn-01" or "http-01"`)
	wantErrors(t, head+ok+"      challenges: [http-01]\n"+rest, `7:20: listeners.https.acme.challenges[0] "http-01": needs listeners.http`)
	wantErrors(t, head+ok+"      renew_window_ratio: 1.5\n"+rest, `7:27: listeners.https.acme.renew_window_ratio 1.5: want 0 < r < 1`)
	wantErrors(t, head+ok+"      check_interval: -1s\n"+rest, `7:23: listeners.https.acme.check_interval: duration "-1s" must not be negative`)
	wantErrors(t, head+ok+"      ca: http://ca.example/dir\n"+rest, `7:11: listeners.https.acme.ca "http://ca.example/dir": want an https:// directory URL`)
	wantErrors(t, head+ok+"      ca_root_file: /nonexistent/root.pem\n"+rest, `7:21: listeners.https.acme.ca_root_file: open /nonexistent/root.pem`)
	wantErrors(t, head+ok+"      domain: [x.example.com]\n"+rest, `7:7: unknown key "domain" in listeners.https.acme (did you mean "domains"?)`)
}

// Changing https.acme is a listener change: it needs a restart.
func TestACMEChangeNeedsRestart(t *testing.T) {
	rest := strings.TrimPrefix(valid, "listeners:\n  http: 127.0.0.1:8080\n")
	cfg := func(domain string) *Config {
		c, err := Parse("t.yaml", []byte("listeners:\n  https:\n    addr: 127.0.0.1:8443\n    acme:\n      domains: ["+domain+"]\n      storage: /tmp/acme\n"+rest))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	var paths []string
	for _, c := range RestartRequired(cfg("a.example.com"), cfg("b.example.com")) {
		paths = append(paths, c.Path)
	}
	if len(paths) != 1 || !strings.Contains(paths[0], "acme") {
		t.Fatalf("restart required for %q; want the acme domains", paths)
	}
}
