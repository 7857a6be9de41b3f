// Package limiter enforces per-tenant limits: concurrent streams, tokens per
// minute and requests per minute, shared across edge nodes through Redis, with
// a local implementation for single nodes and for degraded operation.
package limiter
