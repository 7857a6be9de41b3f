package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"strings"
	"time"
)

// CheckPair reads and parses p and checks that the key matches the leaf
// certificate and that the leaf is valid at now. It returns the leaf. Each
// error names the file it is about (see FileError).
func CheckPair(p Pair, now time.Time) (*x509.Certificate, error) {
	certPEM, keyPEM, err := readPair(p)
	if err != nil {
		return nil, err
	}
	c, err := parsePair(p, certPEM, keyPEM, now)
	if err != nil {
		return nil, err
	}
	return c.Leaf, nil
}

// Covers reports whether any of certs is valid for name the way a client
// checks it: exact DNS names, a wildcard SAN for exactly one leftmost label,
// or an IP SAN for an IP literal. A port on name is ignored. A wildcard name
// ("*.example.com") is covered only by the same wildcard SAN.
func Covers(certs []*x509.Certificate, name string) bool {
	if h, _, err := net.SplitHostPort(name); err == nil {
		name = h
	}
	name = normalizeName(strings.Trim(name, "[]"))
	for _, c := range certs {
		if c == nil {
			continue
		}
		if strings.HasPrefix(name, "*.") {
			if hasDNSName(c, name) {
				return true
			}
			continue
		}
		if c.VerifyHostname(name) == nil {
			return true
		}
	}
	return false
}

func hasDNSName(c *x509.Certificate, name string) bool {
	for _, n := range c.DNSNames {
		if normalizeName(n) == name {
			return true
		}
	}
	return false
}

// readPair reads both files; errors name the file.
func readPair(p Pair) (certPEM, keyPEM []byte, err error) {
	certPEM, err = readFile(p.CertFile)
	if err != nil {
		return nil, nil, certErr(p.CertFile, err)
	}
	keyPEM, err = readFile(p.KeyFile)
	if err != nil {
		return nil, nil, keyErr(p.KeyFile, err)
	}
	return certPEM, keyPEM, nil
}

// maxFileSize bounds how much of a certificate or key file is read; real
// chains are a few kilobytes.
const maxFileSize = 1 << 20

func readFile(name string) ([]byte, error) {
	if name == "" {
		return nil, errors.New("no file name given")
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("reading: %w", unwrapPath(err))
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading: %w", unwrapPath(err))
	}
	if len(b) > maxFileSize {
		return nil, fmt.Errorf("reading: file is larger than %d bytes", maxFileSize)
	}
	return b, nil
}

// unwrapPath drops the path from an *fs.PathError: the FileError around it
// already names the file.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// contentHash identifies the bytes of a pair, to notice changes.
func contentHash(certPEM, keyPEM []byte) [32]byte {
	h := sha256.New()
	h.Write(certPEM)
	h.Write([]byte{0})
	h.Write(keyPEM)
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}

// parsePair builds a tls.Certificate (with Leaf) from PEM bytes and checks
// it at now.
func parsePair(p Pair, certPEM, keyPEM []byte, now time.Time) (*tls.Certificate, error) {
	chain, err := parseChain(certPEM)
	if err != nil {
		return nil, certErr(p.CertFile, err)
	}
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		return nil, certErr(p.CertFile, fmt.Errorf("parsing leaf certificate: %w", err))
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, keyErr(p.KeyFile, err)
	}
	if !publicKeysEqual(leaf.PublicKey, key.Public()) {
		return nil, keyErr(p.KeyFile, fmt.Errorf("%w in %q", ErrKeyMismatch, p.CertFile))
	}
	if err := checkValidity(leaf, now); err != nil {
		return nil, certErr(p.CertFile, err)
	}
	return &tls.Certificate{Certificate: chain, PrivateKey: key, Leaf: leaf}, nil
}

func parseChain(certPEM []byte) ([][]byte, error) {
	var chain [][]byte
	rest := certPEM
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type == "CERTIFICATE" {
			chain = append(chain, block.Bytes)
		}
	}
	if len(chain) == 0 {
		return nil, fmt.Errorf("%w: no CERTIFICATE block found", ErrNotPEM)
	}
	return chain, nil
}

func parseKey(keyPEM []byte) (crypto.Signer, error) {
	rest := keyPEM
	sawCert := false
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		switch {
		case block.Type == "CERTIFICATE":
			sawCert = true
		case block.Type == "ENCRYPTED PRIVATE KEY" || block.Headers["Proc-Type"] != "":
			return nil, errors.New("encrypted private keys are not supported")
		case strings.HasSuffix(block.Type, "PRIVATE KEY"):
			return parseKeyDER(block.Bytes)
		}
	}
	if sawCert {
		return nil, fmt.Errorf("%w: no PRIVATE KEY block, only a CERTIFICATE (are cert_file and key_file swapped?)", ErrNotPEM)
	}
	return nil, fmt.Errorf("%w: no PRIVATE KEY block found", ErrNotPEM)
}

func parseKeyDER(der []byte) (crypto.Signer, error) {
	var key any
	var err error
	if key, err = x509.ParsePKCS8PrivateKey(der); err != nil {
		if key, err = x509.ParsePKCS1PrivateKey(der); err != nil {
			if key, err = x509.ParseECPrivateKey(der); err != nil {
				return nil, errors.New("parsing private key: not a PKCS #8, PKCS #1 or SEC 1 key")
			}
		}
	}
	switch k := key.(type) {
	case *rsa.PrivateKey:
		return k, nil
	case *ecdsa.PrivateKey:
		return k, nil
	case ed25519.PrivateKey:
		return k, nil
	}
	return nil, fmt.Errorf("parsing private key: unsupported key type %T", key)
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ea, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ea.Equal(b)
}

func checkValidity(leaf *x509.Certificate, now time.Time) error {
	const layout = time.RFC3339
	if now.After(leaf.NotAfter) {
		return fmt.Errorf("%w: not valid after %s (now %s)",
			ErrExpired, leaf.NotAfter.UTC().Format(layout), now.UTC().Format(layout))
	}
	if now.Before(leaf.NotBefore) {
		return fmt.Errorf("%w: not valid before %s (now %s)",
			ErrNotYetValid, leaf.NotBefore.UTC().Format(layout), now.UTC().Format(layout))
	}
	return nil
}
