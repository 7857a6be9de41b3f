package certs

// Pair is one certificate chain and its private key, both PEM files.
type Pair struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// Config describes the certificates of one TLS listener.
type Config struct {
	// Certificates are chosen by SNI (exact names first, then wildcards);
	// the first pair is the default for clients that send no SNI.
	Certificates []Pair `yaml:"certificates"`
	// DevCert makes an in-memory self-signed certificate for localhost,
	// 127.0.0.1 and ::1 instead of reading files.
	DevCert bool `yaml:"dev_cert"`
	// MinVersion is the lowest TLS version accepted: "1.2" (default) or "1.3".
	MinVersion string `yaml:"min_version"`
}
