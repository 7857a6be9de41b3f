package node

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
)

// genTenantsFile is n tenants, one key each, the way a generator writes them.
func genTenantsFile(n int, revoke int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		if i == revoke {
			continue
		}
		h := sha256.Sum256([]byte(fmt.Sprint("key-", i)))
		fmt.Fprintf(&b, "- id: tenant-%d\n  keys: [sha256:%s]\n  limits: {max_concurrency: 8, tokens_per_minute: 100000}\n", i, hex.EncodeToString(h[:]))
	}
	return b.String()
}

// A tenants file of 100,000 tenants changes (one tenant revoked, then
// back): read, validate, compare, index and swap in.
func BenchmarkReloadTenants100k(b *testing.B) {
	files := []string{genTenantsFile(100_000, -1), genTenantsFile(100_000, 500)}
	tn := startFileNode(b, nodeConfig{TenantsRaw: "tenants_file: tenants.yaml\n"}.String(), "tenants.yaml", files[0])
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		tn.write("tenants.yaml", files[(i+1)%2])
		if res := tn.n.ReloadTenants(TriggerTenants); res.Result != ResultOK {
			b.Fatalf("%+v", res)
		}
	}
}
