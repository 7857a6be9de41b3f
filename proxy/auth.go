package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"

	"github.com/sluice-proxy/sluice/limiter"
)

// Tenant is an authenticated API tenant.
type Tenant struct {
	ID     string
	Limits limiter.Limits
}

// Tenants maps API key hashes to tenants. It is immutable once built and safe
// for simultaneous use by multiple goroutines; lookups are O(1).
type Tenants struct {
	byHash map[[sha256.Size]byte]*Tenant
}

// NewTenants indexes tenants by their key hashes. The configs must have
// been validated (every key a "sha256:<hex>" hash).
func NewTenants(cfgs []TenantConfig) *Tenants {
	t := &Tenants{byHash: make(map[[sha256.Size]byte]*Tenant, len(cfgs))}
	for _, c := range cfgs {
		tenant := &Tenant{ID: c.ID, Limits: c.Limits}
		for _, k := range c.Keys {
			var h [sha256.Size]byte
			raw, err := hex.DecodeString(strings.TrimPrefix(k, "sha256:"))
			if err != nil || len(raw) != sha256.Size {
				continue
			}
			copy(h[:], raw)
			t.byHash[h] = tenant
		}
	}
	return t
}

// Len is the number of tenants' keys indexed.
func (t *Tenants) Len() int { return len(t.byHash) }

// Lookup returns the tenant owning key, or nil.
//
// API keys are long random secrets, so a single SHA-256 is the right hash:
// a slow password hash would let anyone burn the edge's CPU with bad keys,
// and a fast hash of a high-entropy key cannot be brute-forced.
func (t *Tenants) Lookup(key string) *Tenant {
	if key == "" {
		return nil
	}
	// Timing of the map lookup reveals nothing useful: an attacker
	// controls the key, not its hash.
	return t.byHash[sha256.Sum256([]byte(key))]
}

// HashKey returns the config form of an API key's hash: "sha256:<hex>".
func HashKey(key string) string {
	h := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(h[:])
}

// apiKey extracts the API key from Authorization: Bearer, x-api-key or, when
// allowQuery is set, the api_key query parameter.
func apiKey(r *http.Request, allowQuery bool) string {
	if a := r.Header.Get("Authorization"); a != "" {
		if len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
			return strings.TrimSpace(a[7:])
		}
		return ""
	}
	if k := r.Header.Get("X-Api-Key"); k != "" {
		return k
	}
	if allowQuery {
		return r.URL.Query().Get(queryKeyParam)
	}
	return ""
}

const queryKeyParam = "api_key"
