package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCheckPair(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	notAfter := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)
	c, k := ca.issue(t, leafSpec{cn: "ok", dns: []string{"ok.test"}, notAfter: notAfter})
	good := writePair(t, dir, "good", c, k)
	otherC, _ := ca.issue(t, leafSpec{cn: "other", dns: []string{"ok.test"}})
	mismatch := Pair{CertFile: writePair(t, dir, "other", otherC, nil).CertFile, KeyFile: good.KeyFile}
	garbage := writePair(t, dir, "garbage", []byte("not pem at all"), []byte("nor this"))
	encrypted := writePair(t, dir, "enc", c, pem.EncodeToMemory(&pem.Block{
		Type: "RSA PRIVATE KEY", Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"}, Bytes: []byte{1}}))
	huge := Pair{CertFile: filepath.Join(dir, "huge.crt"), KeyFile: good.KeyFile}
	writeFile(t, huge.CertFile, make([]byte, maxFileSize+1))
	now := time.Now()
	for _, tc := range []struct {
		name  string
		pair  Pair
		now   time.Time
		is    error
		wants []string // substrings of the message
	}{
		{"missing cert", Pair{CertFile: filepath.Join(dir, "nope.crt"), KeyFile: good.KeyFile}, now,
			fs.ErrNotExist, []string{`certificate file "` + filepath.Join(dir, "nope.crt"), "no such file"}},
		{"missing key", Pair{CertFile: good.CertFile, KeyFile: filepath.Join(dir, "nope.key")}, now,
			fs.ErrNotExist, []string{`key file "` + filepath.Join(dir, "nope.key")}},
		{"cert is a directory", Pair{CertFile: dir, KeyFile: good.KeyFile}, now,
			nil, []string{`certificate file "` + dir, "is a directory"}},
		{"cert too large", huge, now, nil, []string{huge.CertFile, "larger than"}},
		{"unset cert", Pair{KeyFile: good.KeyFile}, now, nil, []string{"certificate file not set"}},
		{"cert not PEM", garbage, now, ErrNotPEM, []string{garbage.CertFile, "CERTIFICATE"}},
		{"key not PEM", Pair{CertFile: good.CertFile, KeyFile: garbage.KeyFile}, now,
			ErrNotPEM, []string{garbage.KeyFile, "PRIVATE KEY"}},
		{"swapped", Pair{CertFile: good.KeyFile, KeyFile: good.CertFile}, now,
			ErrNotPEM, []string{good.KeyFile}},
		{"key holds a certificate", Pair{CertFile: good.CertFile, KeyFile: good.CertFile}, now,
			ErrNotPEM, []string{"swapped?"}},
		{"encrypted key", encrypted, now, nil, []string{encrypted.KeyFile, "encrypted"}},
		{"mismatch", mismatch, now, ErrKeyMismatch, []string{good.KeyFile, mismatch.CertFile}},
		{"expired", good, notAfter.Add(time.Minute), ErrExpired,
			[]string{good.CertFile, "not valid after 2031-05-06T07:08:09Z"}},
		{"not yet valid", good, now.Add(-2 * time.Hour), ErrNotYetValid,
			[]string{good.CertFile, "not valid before"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leaf, err := CheckPair(tc.pair, tc.now)
			if err == nil {
				t.Fatalf("CheckPair succeeded (leaf %v); want an error", leaf.Subject)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("errors.Is(%q, %v) = false", err, tc.is)
			}
			var fe *FileError
			if !errors.As(err, &fe) {
				t.Errorf("%q is not a *FileError", err)
			}
			for _, w := range tc.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	leaf, err := CheckPair(good, now)
	if err != nil {
		t.Fatalf("CheckPair(good): %v", err)
	}
	if leaf.Subject.CommonName != "ok" {
		t.Errorf("leaf: got %q; want %q", leaf.Subject.CommonName, "ok")
	}
}

func TestCheckPairKeyFormats(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	// PKCS #1 RSA (issue with rsa) and PKCS #8 ECDSA (issue default).
	for i, useRSA := range []bool{true, false} {
		c, k := ca.issue(t, leafSpec{cn: "k", dns: []string{"k.test"}, rsa: useRSA})
		if _, err := CheckPair(writePair(t, dir, fmt.Sprint("fmt", i), c, k), time.Now()); err != nil {
			t.Errorf("rsa=%v: %v", useRSA, err)
		}
	}
	// SEC 1 ECDSA ("EC PRIVATE KEY"), with EC PARAMETERS before it as
	// openssl ecparam -genkey writes it.
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM := append(pem.EncodeToMemory(&pem.Block{Type: "EC PARAMETERS", Bytes: []byte{6, 8, 42, 134, 72, 206, 61, 3, 1, 7}}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})...)
	tmpl := &x509.Certificate{SerialNumber: nextSerial(), DNSNames: []string{"sec1.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	certDER, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: certDER})
	if _, err := CheckPair(writePair(t, dir, "sec1", certPEM, keyPEM), time.Now()); err != nil {
		t.Errorf("SEC 1 key: %v", err)
	}
}

func TestChainIsServed(t *testing.T) {
	ca := newTestCA(t)
	c, k := ca.issue(t, leafSpec{cn: "leaf", dns: []string{"chain.test"}})
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})
	p := writePair(t, t.TempDir(), "chain", append(c, caPEM...), k)
	s, err := New(Config{Certificates: []Pair{p}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, s.TLSConfig())
	conn, err := dial(addr, "chain.test", ca.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if n := len(conn.ConnectionState().PeerCertificates); n != 2 {
		t.Errorf("peer sent %d certificates; want 2 (leaf and chain)", n)
	}
}

func TestCovers(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	var leaves []*x509.Certificate
	for i, spec := range []leafSpec{
		{cn: "a", dns: []string{"api.example.com", "*.apps.example.com"}},
		{cn: "b", ips: []net.IP{net.ParseIP("127.0.0.2"), net.ParseIP("::1")}},
	} {
		c, k := ca.issue(t, spec)
		leaf, err := CheckPair(writePair(t, dir, fmt.Sprint(i), c, k), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		leaves = append(leaves, leaf)
	}
	for name, want := range map[string]bool{
		"api.example.com":      true,
		"API.example.com.":     true,
		"api.example.com:8443": true,
		"x.apps.example.com":   true,
		"*.apps.example.com":   true,
		"apps.example.com":     false,
		"a.b.apps.example.com": false,
		"*.example.com":        false,
		"other.example.com":    false,
		"127.0.0.2":            true,
		"::1":                  true,
		"[::1]:443":            true,
		"127.0.0.1":            false,
		"":                     false,
	} {
		if got := Covers(leaves, name); got != want {
			t.Errorf("Covers(%q) = %v; want %v", name, got, want)
		}
	}
	if Covers(nil, "api.example.com") {
		t.Error("Covers(nil) = true")
	}
}

func TestConfigValidate(t *testing.T) {
	err := Config{Certificates: []Pair{{}}, MinVersion: "1.0"}.Validate()
	for _, w := range []string{`min_version "1.0"`, "certificates[0]: cert_file is empty", "certificates[0]: key_file is empty"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Validate: got %v; want it to mention %q", err, w)
		}
	}
	if err := (Config{DevCert: true, MinVersion: "1.3"}).Validate(); err != nil {
		t.Errorf("Validate(dev cert, 1.3): %v", err)
	}
}
