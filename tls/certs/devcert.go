package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"time"
)

// DevCertValidity is how long a development certificate is valid.
const DevCertValidity = 30 * 24 * time.Hour

// SPKIPin returns the base64 SHA-256 hash of cert's SubjectPublicKeyInfo,
// the form taken by curl --pinnedpubkey "sha256//PIN" and Chrome's
// --ignore-certificate-errors-spki-list=PIN.
func SPKIPin(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return base64.StdEncoding.EncodeToString(sum[:])
}

// newDevCert makes a self-signed ECDSA P-256 certificate for localhost,
// 127.0.0.1 and ::1, valid from an hour before now for DevCertValidity.
// It is marked as its own CA so that it can be used as a trust anchor
// (curl --cacert, tls.Config.RootCAs).
func newDevCert(now time.Time) (*tls.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating dev key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, fmt.Errorf("generating dev serial: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "localhost", Organization: []string{"Sluice development"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(DevCertValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("creating dev certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parsing dev certificate: %w", err)
	}
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pemBytes, nil
}

// addDevCert appends a fresh development certificate to the entries.
func (s *Store) addDevCert() error {
	c, pemBytes, err := newDevCert(s.now())
	if err != nil {
		return err
	}
	s.entries = append(s.entries, &entry{dev: true, cert: c})
	s.devPEM = pemBytes
	s.log.Info("tls development certificate generated",
		"names", "localhost,127.0.0.1,::1", "not_after", c.Leaf.NotAfter.UTC(), "spki_pin", SPKIPin(c.Leaf))
	return nil
}
