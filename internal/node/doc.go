// Package node runs one Sluice node from a config: it starts the
// simulators, pools, limiter, certificates and listeners (Start), reloads
// the config, the tenants file and the certificates while the node serves
// (Reload, WatchConfig, POST /-/reload and GET /debug/config on the admin
// listener), and drains and stops it (Shutdown, Close).
//
// A reload is all or nothing: a config that is invalid or changes a key a
// running node cannot apply (listeners, redis, the node's name) changes
// nothing. Otherwise new requests use the new routes, pools, tenants and
// limits, running ones finish on the state they started with, and pools
// and simulators that only the old state used are stopped once its
// requests are done. One file watcher (internal/filewatch) covers the
// config file, the tenants file and the certificate files.
//
// Only cmd/sluice imports it; proxy, routing, limiter and tls/certs do not
// know it exists.
package node
