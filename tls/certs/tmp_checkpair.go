package certs

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"time"
)

// CheckPair is a placeholder until the certs package lands.
func CheckPair(p Pair, now time.Time) (*x509.Certificate, error) {
	c, err := tls.LoadX509KeyPair(p.CertFile, p.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", p.CertFile, err)
	}
	return x509.ParseCertificate(c.Certificate[0])
}
