package certs

import (
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
)

// Reload re-reads every certificate pair now (for SIGHUP) and swaps in each
// one that changed and is valid. A pair that fails to load keeps serving its
// previous certificate; the error is logged, counted and returned (joined
// over all failing pairs). Unchanged files are not counted as a reload.
func (s *Store) Reload() error {
	return s.check(true)
}

// Check re-reads every certificate pair and swaps in each one whose content
// changed since it was last looked at and is valid. Content (or an error)
// already looked at is skipped, so a broken file is logged, counted and
// returned once, not at every poll. File watchers call it.
func (s *Store) Check() error {
	return s.check(false)
}

// check looks at every file pair; force looks again at content already
// looked at.
func (s *Store) check(force bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	changed := false
	for _, e := range s.entries {
		if e.dev {
			continue
		}
		swapped, err := s.checkEntry(e, force)
		changed = changed || swapped
		errs = append(errs, err)
	}
	if changed {
		s.publish()
	}
	return errors.Join(errs...)
}

// checkEntry reloads one pair if its content changed. It reports whether
// e.cert was replaced.
func (s *Store) checkEntry(e *entry, force bool) (bool, error) {
	certPEM, keyPEM, err := readPair(e.pair)
	seen := contentHash(certPEM, keyPEM)
	if err != nil {
		seen = sha256.Sum256([]byte(err.Error()))
	}
	if seen == e.attempt && !force {
		return false, nil
	}
	e.attempt = seen
	if err == nil && seen == e.loaded {
		return false, nil
	}
	var c *tls.Certificate
	if err == nil {
		c, err = parsePair(e.pair, certPEM, keyPEM, s.now())
	}
	if err != nil {
		s.met.reloadErrors.WithLabelValues(faultFile(e.pair, err)).Inc()
		s.log.Warn("tls certificate reload failed; keeping the previous certificate",
			"cert_file", e.pair.CertFile, "key_file", e.pair.KeyFile, "err", err)
		return false, fmt.Errorf("reloading: %w", err)
	}
	e.cert, e.loaded = c, seen
	s.met.reloads.Inc()
	s.log.Info("tls certificate reloaded", "cert_file", e.pair.CertFile,
		"name", primaryName(c), "not_after", c.Leaf.NotAfter.UTC(), "spki_pin", SPKIPin(c.Leaf))
	return true, nil
}

// faultFile is the file an error is about, for the error counter's label.
func faultFile(p Pair, err error) string {
	var fe *FileError
	if errors.As(err, &fe) && fe.File != "" {
		return fe.File
	}
	return p.CertFile
}
