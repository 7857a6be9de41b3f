package limiter

import "strings"

// Key layout. Every key of a tenant carries the hash tag {t:<tenant>}, so a
// tenant's keys live in one Redis Cluster slot and one script may touch
// them all. Tenant, model and request id are escaped so that no two
// tenants' keys can collide.
//
//	{t:<tenant>}[:m:<model>]:c   leases (zset: request id -> expiry µs)
//	{t:<tenant>}[:m:<model>]:r   requests TAT
//	{t:<tenant>}[:m:<model>]:k   tokens TAT
//	{t:<tenant>}[:m:<model>]:i   input tokens TAT
//	{t:<tenant>}[:m:<model>]:o   output tokens TAT
//	{t:<tenant>}:a:<id>          admission record ("in out", or "s" once settled)
//	sluice:nodes                 live edge nodes (zset: node id -> last beat µs)

var keyEscaper = strings.NewReplacer("%", "%25", ":", "%3A", "{", "%7B", "}", "%7D")

// scopePrefix names a lease set and its buckets.
func scopePrefix(tenant, model string, scoped bool) string {
	p := "{t:" + keyEscaper.Replace(tenant) + "}"
	if scoped {
		p += ":m:" + keyEscaper.Replace(model)
	}
	return p
}

func recordKey(tenant, id string) string {
	return "{t:" + keyEscaper.Replace(tenant) + "}:a:" + keyEscaper.Replace(id)
}

// nodesKey is the set of live edge nodes, outside any tenant's slot.
const nodesKey = "sluice:nodes"
