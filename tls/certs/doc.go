// Package certs loads TLS certificates from files, chooses them by SNI,
// reloads them when the files change, makes a self-signed development
// certificate, and builds the *tls.Config for TCP and QUIC listeners.
//
// It lives in tls/certs (package certs) so that callers can import it beside
// crypto/tls without an alias.
package certs
