// Package layers guards the import directions of DESIGN.md and
// docs/ARCHITECTURE.md: cmd → configs → (proxy, limiter, routing, tls/certs),
// routing and limiter independent of proxy and of each other, configs
// imported only by cmd and the lifecycle package internal/node, and the
// proxy sub-packages (listen, observe, ws) kept below proxy. The package has
// no code of its own; its test lists the module's packages with one
// `go list` call and fails, naming the import and the rule, when a
// production or test import breaks one of the rules kept in one table.
package layers
