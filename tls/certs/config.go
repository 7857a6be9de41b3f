package certs

import (
	"crypto/tls"
	"errors"
	"fmt"
	"time"
)

// Pair is one certificate chain and its private key, both PEM files.
type Pair struct {
	// CertFile holds the leaf certificate first, then any intermediates.
	// Required.
	CertFile string `yaml:"cert_file"`
	// KeyFile holds the PEM private key (PKCS #8, PKCS #1 or SEC 1) of the
	// leaf. Encrypted keys are not supported. Required.
	KeyFile string `yaml:"key_file"`
}

// Config describes the certificates of one TLS listener.
type Config struct {
	// Certificates are chosen by SNI (exact names first, then wildcards);
	// the first pair is the default for clients that send no SNI.
	Certificates []Pair `yaml:"certificates"`
	// DevCert makes an in-memory self-signed certificate for localhost,
	// 127.0.0.1 and ::1 instead of reading files. If Certificates are also
	// given, the development certificate comes after them (so it is the
	// default only when there are no file pairs).
	DevCert bool `yaml:"dev_cert"`
	// MinVersion is the lowest TLS version accepted: "1.2" (default) or "1.3".
	MinVersion string `yaml:"min_version"`
	// PollInterval is how often the certificate files are re-read and
	// compared by content hash, in case file system events were missed.
	// Zero means 5s; a negative value disables polling (events only).
	PollInterval time.Duration `yaml:"poll_interval"`
	// ACME obtains and renews certificates for its domains from an ACME
	// CA (see ACMEConfig); they are chosen for those names (and for
	// handshakes without SNI when there are no other certificates). Nil:
	// none.
	ACME *ACMEConfig `yaml:"acme"`
}

// DefaultPollInterval is the PollInterval used when the field is zero.
const DefaultPollInterval = 5 * time.Second

// Validate checks the settings that need no file access: a version that is
// known, and at least one certificate source with both file names set.
// Use CheckPair to check the files themselves.
func (c Config) Validate() error {
	var errs []error
	if _, err := parseMinVersion(c.MinVersion); err != nil {
		errs = append(errs, err)
	}
	if len(c.Certificates) == 0 && !c.DevCert && c.ACME == nil {
		errs = append(errs, ErrNoCertificates)
	}
	if c.ACME != nil {
		if err := c.ACME.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	for i, p := range c.Certificates {
		if p.CertFile == "" {
			errs = append(errs, fmt.Errorf("certificates[%d]: cert_file is empty", i))
		}
		if p.KeyFile == "" {
			errs = append(errs, fmt.Errorf("certificates[%d]: key_file is empty", i))
		}
	}
	return errors.Join(errs...)
}

func parseMinVersion(v string) (uint16, error) {
	switch v {
	case "", "1.2":
		return tls.VersionTLS12, nil
	case "1.3":
		return tls.VersionTLS13, nil
	}
	return 0, fmt.Errorf("min_version %q: want \"1.2\" or \"1.3\"", v)
}

func (c Config) pollInterval() time.Duration {
	if c.PollInterval == 0 {
		return DefaultPollInterval
	}
	return c.PollInterval
}
