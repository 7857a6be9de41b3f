// Package routing holds the route table, backend pools, load signals, the
// least-queued picker, backend health and the edge admission queue.
package routing
