package certs

import (
	"errors"
	"fmt"
)

// Conditions that callers may branch on with errors.Is.
var (
	// ErrNoCertificates: the Config names no certificate pair and no
	// development certificate.
	ErrNoCertificates = errors.New("no certificates configured (set certificates or dev_cert)")
	// ErrNotPEM: a file holds no PEM block of the expected type.
	ErrNotPEM = errors.New("not PEM")
	// ErrKeyMismatch: the private key does not belong to the certificate.
	ErrKeyMismatch = errors.New("private key does not match the certificate")
	// ErrExpired: the certificate's NotAfter has passed.
	ErrExpired = errors.New("certificate has expired")
	// ErrNotYetValid: the certificate's NotBefore is still ahead.
	ErrNotYetValid = errors.New("certificate is not valid yet")
)

// FileError is an error about one certificate or key file. Err is one of the
// sentinels above, or the underlying I/O or parse error (so
// errors.Is(err, fs.ErrNotExist) works for missing files).
type FileError struct {
	// Kind is "certificate" or "key".
	Kind string
	// File is the path as configured; empty when it was not set.
	File string
	// Err is what went wrong.
	Err error
}

func (e *FileError) Error() string {
	if e.File == "" {
		return e.Kind + " file not set"
	}
	return fmt.Sprintf("%s file %q: %v", e.Kind, e.File, e.Err)
}

func (e *FileError) Unwrap() error { return e.Err }

func certErr(file string, err error) error {
	return &FileError{Kind: "certificate", File: file, Err: err}
}

func keyErr(file string, err error) error {
	return &FileError{Kind: "key", File: file, Err: err}
}
