package configs

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
)

// Admin secures the admin listener (listeners.admin): a bearer token for
// everything but /healthz, /readyz and /metrics, and the host names it
// answers to. Host and Origin are always checked (see observe.AdminGuard).
type Admin struct {
	// TokenFile names a file whose content (surrounding white space
	// removed) is the bearer token the admin listener requires, relative
	// to this file's directory. It is read on every request that needs it,
	// so a new token takes effect when the file is replaced. Empty means
	// no token: then bind listeners.admin to loopback only (sluice check
	// warns otherwise).
	TokenFile string `yaml:"token_file"`
	// Hosts are the names the admin listener answers to in Host besides IP
	// addresses and localhost (e.g. the DNS name Prometheus scrapes it
	// by). Nil means none.
	Hosts []string `yaml:"hosts"`
}

// AdminTokenPath is admin.token_file resolved against the config's
// directory; "" when there is none.
func (c *Config) AdminTokenPath() string {
	f := c.Admin.TokenFile
	if f == "" || filepath.IsAbs(f) || c.File == DefaultName {
		return f
	}
	return filepath.Join(filepath.Dir(c.File), f)
}

// AdminToken reads the admin token: "" without admin.token_file, an error
// when the file cannot be read or holds no token.
func (c *Config) AdminToken() (string, error) {
	path := c.AdminTokenPath()
	if path == "" {
		return "", nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("admin.token_file: %w", err)
	}
	tok := strings.TrimSpace(string(data))
	if tok == "" {
		return "", fmt.Errorf("admin.token_file: %s holds no token", path)
	}
	return tok, nil
}

// AdminExposed reports whether the admin listener binds an address other
// than loopback (":9090", "0.0.0.0:9090", a LAN address) with no token:
// anyone who reaches the port may reload the config and read /debug.
func (c *Config) AdminExposed() bool {
	if c.Listeners.Admin == "" || c.Admin.TokenFile != "" {
		return false
	}
	host, _, err := net.SplitHostPort(c.Listeners.Admin)
	if err != nil {
		return true
	}
	if host == "localhost" {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err != nil || !ip.IsLoopback()
}

func (v *validator) admin() {
	a := v.c.Admin
	for i, h := range a.Hosts {
		if h == "" || strings.ContainsAny(h, ":/ ") {
			v.errorf(fmt.Sprintf("admin.hosts[%d]", i), "admin.hosts[%d]: %q must be a host name without port", i, h)
		}
	}
	if a.TokenFile != "" && v.c.Listeners.Admin == "" {
		v.errorf("admin.token_file", "admin.token_file: set listeners.admin too (there is no admin listener)")
	}
}
