// Package limiter enforces per-tenant limits — concurrent streams, tokens
// per minute (total, and optionally input and output) and requests per
// minute, optionally per model — shared across edge nodes through Redis:
// Redis admits each request with one all-or-nothing Lua script on Redis
// TIME (GCRA buckets and a lease set under the tenant's hash tag, Cluster
// safe), Settle reconciles the charged estimate with the actual usage, and
// a per-node heartbeat (Run) renews the concurrency leases; Shared puts a
// local first line (deny cache, local ceiling), a timeout and a circuit
// breaker with the store-failure policies (local share, open, closed) in
// front of it; Local is the in-process implementation for a single node
// and the degraded fallback; SetHeaders and ErrorBody render a Decision as
// IETF RateLimit/RateLimit-Policy and OpenAI x-ratelimit-* fields and an
// OpenAI-shaped error body.
package limiter
