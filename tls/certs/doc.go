// Package certs loads TLS certificates from files, chooses them by SNI,
// reloads them when the files change, makes a self-signed development
// certificate, and builds the *tls.Config for TCP and QUIC listeners.
//
// A Store picks a certificate for each handshake in this order: a
// certificate with the exact SNI name among its DNS SANs; one with a
// wildcard SAN ("*.example.com") matching the name minus its first label;
// without SNI, one with an IP SAN equal to the local address the client
// dialled; else the first configured pair. Among several candidates for a
// name, the first the client supports (e.g. ECDSA vs RSA) wins, in config
// order. Store.Check (called by a file watcher on the directories
// Store.WatchDirs lists) and Store.Reload re-read the files and swap in a
// new index atomically; a broken or expired new file is logged and counted,
// and the previous certificate keeps serving.
//
// It lives in tls/certs (package certs) so that callers can import it beside
// crypto/tls without an alias.
package certs
