// Package tls is the home of Sluice's TLS support; the code lives in the
// certs subpackage so that it does not shadow crypto/tls for its callers.
package tls
