package certs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-proxy/sluice/internal/filewatch"
)

// rotation is one store serving a single pair from files under test.
type rotation struct {
	ca    *testCA
	pair  Pair
	store *Store
	// watcher reloads store on file changes (see runStore).
	watcher *filewatch.Watcher
	reg     *prometheus.Registry
	addr    string
}

// newRotation serves "old" for rot.test; poll <= 0 disables polling and
// noWatch disables file events.
func newRotation(t *testing.T, dir string, poll time.Duration, noWatch bool) *rotation {
	t.Helper()
	ca := newTestCA(t)
	c, k := ca.issue(t, leafSpec{cn: "old", dns: []string{"rot.test"}})
	p := writePair(t, dir, "tls", c, k)
	reg := prometheus.NewRegistry()
	s, err := New(Config{Certificates: []Pair{p}, PollInterval: poll}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	w := runStore(t, s, noWatch)
	return &rotation{ca: ca, pair: p, store: s, watcher: w, reg: reg, addr: serveTLS(t, s.TLSConfig())}
}

func (r *rotation) errorsFor(file string) float64 {
	return testutil.ToFloat64(r.store.met.reloadErrors.WithLabelValues(file))
}

// rotateAndCheck opens a connection, runs rotate, waits until a new
// handshake sees "new", and checks the old connection still works and
// still shows the old certificate.
func (r *rotation) rotateAndCheck(t *testing.T, rotate func(certPEM, keyPEM []byte)) {
	t.Helper()
	old, err := dial(r.addr, "rot.test", r.ca.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := roundTrip(old, "before"); err != nil {
		t.Fatal(err)
	}
	c, k := r.ca.issue(t, leafSpec{cn: "new", dns: []string{"rot.test"}})
	rotate(c, k)
	eventually(t, "new certificate served", func() bool { return peerCN(t, r.addr, "rot.test") == "new" })
	if err := roundTrip(old, "after"); err != nil {
		t.Fatalf("connection opened before the reload: %v", err)
	}
	if cn := old.ConnectionState().PeerCertificates[0].Subject.CommonName; cn != "old" {
		t.Errorf("old connection's certificate: got %q; want %q", cn, "old")
	}
	if n := testutil.ToFloat64(r.store.met.reloads); n < 1 {
		t.Errorf("sluice_tls_reloads_total = %v; want >= 1", n)
	}
	c2, err := dial(r.addr, "rot.test", r.ca.pool, nil)
	if err != nil {
		t.Fatalf("verified handshake after reload: %v", err)
	}
	c2.Close()
}

func TestRotationByEvents(t *testing.T) {
	// Polling is off: only file system events can trigger these reloads.
	t.Run("rewrite in place", func(t *testing.T) {
		r := newRotation(t, t.TempDir(), -1, false)
		r.rotateAndCheck(t, func(c, k []byte) {
			writeFile(t, r.pair.KeyFile, k)
			writeFile(t, r.pair.CertFile, c)
		})
	})
	t.Run("atomic rename", func(t *testing.T) {
		r := newRotation(t, t.TempDir(), -1, false)
		r.rotateAndCheck(t, func(c, k []byte) {
			renameInto(t, r.pair.KeyFile, k)
			renameInto(t, r.pair.CertFile, c)
		})
	})
	t.Run("kubernetes symlink swap", func(t *testing.T) {
		testKubernetesSwap(t)
	})
}

// testKubernetesSwap lays files out like a Kubernetes secret volume:
// tls.crt -> ..data/tls.crt, ..data -> ..v1; an update writes ..v2 and
// renames a new ..data symlink over the old one.
func testKubernetesSwap(t *testing.T) {
	ca := newTestCA(t)
	vol := t.TempDir()
	c, k := ca.issue(t, leafSpec{cn: "old", dns: []string{"rot.test"}})
	writeVersion(t, vol, "..v1", c, k)
	mustSymlink(t, "..v1", filepath.Join(vol, "..data"))
	mustSymlink(t, "..data/tls.crt", filepath.Join(vol, "tls.crt"))
	mustSymlink(t, "..data/tls.key", filepath.Join(vol, "tls.key"))
	p := Pair{CertFile: filepath.Join(vol, "tls.crt"), KeyFile: filepath.Join(vol, "tls.key")}
	s, err := New(Config{Certificates: []Pair{p}, PollInterval: -1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	runStore(t, s, false)
	r := &rotation{ca: ca, pair: p, store: s, addr: serveTLS(t, s.TLSConfig())}
	r.rotateAndCheck(t, func(c, k []byte) {
		writeVersion(t, vol, "..v2", c, k)
		mustSymlink(t, "..v2", filepath.Join(vol, "..data_tmp"))
		if err := os.Rename(filepath.Join(vol, "..data_tmp"), filepath.Join(vol, "..data")); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(filepath.Join(vol, "..v1")); err != nil {
			t.Fatal(err)
		}
	})
}

func writeVersion(t *testing.T, vol, name string, certPEM, keyPEM []byte) {
	t.Helper()
	if err := os.Mkdir(filepath.Join(vol, name), 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(vol, name, "tls.crt"), certPEM)
	writeFile(t, filepath.Join(vol, name, "tls.key"), keyPEM)
}

func mustSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func TestRotationByPolling(t *testing.T) {
	// No file system events: only the poll can notice the change.
	r := newRotation(t, t.TempDir(), 50*time.Millisecond, true)
	r.rotateAndCheck(t, func(c, k []byte) {
		renameInto(t, r.pair.KeyFile, k)
		renameInto(t, r.pair.CertFile, c)
	})
}

func TestBrokenReloadKeepsOld(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault string // "cert" or "key": which file the error is counted for
		write func(t *testing.T, r *rotation)
	}{
		{"garbage certificate", "cert", func(t *testing.T, r *rotation) {
			renameInto(t, r.pair.CertFile, []byte("this is not a certificate\n"))
		}},
		{"garbage key", "key", func(t *testing.T, r *rotation) {
			renameInto(t, r.pair.KeyFile, []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"))
		}},
		{"mismatched key", "key", func(t *testing.T, r *rotation) {
			c, _ := r.ca.issue(t, leafSpec{cn: "new", dns: []string{"rot.test"}})
			renameInto(t, r.pair.CertFile, c) // the old key stays
		}},
		{"expired", "cert", func(t *testing.T, r *rotation) {
			c, k := r.ca.issue(t, leafSpec{cn: "new", dns: []string{"rot.test"},
				notBefore: time.Now().Add(-48 * time.Hour), notAfter: time.Now().Add(-time.Hour)})
			renameInto(t, r.pair.KeyFile, k)
			renameInto(t, r.pair.CertFile, c)
		}},
		{"deleted key", "key", func(t *testing.T, r *rotation) {
			if err := os.Remove(r.pair.KeyFile); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRotation(t, t.TempDir(), 100*time.Millisecond, false)
			file := r.pair.CertFile
			if tc.fault == "key" {
				file = r.pair.KeyFile
			}
			tc.write(t, r)
			eventually(t, "reload error counted", func() bool { return r.errorsFor(file) >= 1 })
			if cn := peerCN(t, r.addr, "rot.test"); cn != "old" {
				t.Errorf("after a broken reload: serving %q; want %q", cn, "old")
			}
			if n := testutil.ToFloat64(r.store.met.reloads); n != 0 {
				t.Errorf("sluice_tls_reloads_total = %v; want 0", n)
			}
			// A good pair afterwards is picked up.
			c, k := r.ca.issue(t, leafSpec{cn: "fixed", dns: []string{"rot.test"}})
			renameInto(t, r.pair.KeyFile, k)
			renameInto(t, r.pair.CertFile, c)
			eventually(t, "fixed certificate served", func() bool { return peerCN(t, r.addr, "rot.test") == "fixed" })
		})
	}
}

func TestBrokenFileCountedOnce(t *testing.T) {
	ca := newTestCA(t)
	c, k := ca.issue(t, leafSpec{cn: "old", dns: []string{"rot.test"}})
	p := writePair(t, t.TempDir(), "tls", c, k)
	s, err := New(Config{Certificates: []Pair{p}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, p.CertFile, []byte("garbage"))
	for range 3 {
		err = s.check(false)
	}
	if got := testutil.ToFloat64(s.met.reloadErrors.WithLabelValues(p.CertFile)); got != 1 {
		t.Errorf("errors after three checks of one broken file: %v; want 1", got)
	}
	if err != nil {
		t.Errorf("repeated check of an already reported file returned %v; want nil", err)
	}
	// A forced reload reports it again.
	if err := s.Reload(); !errors.Is(err, ErrNotPEM) || !strings.Contains(err.Error(), p.CertFile) {
		t.Errorf("Reload: got %v; want ErrNotPEM naming %s", err, p.CertFile)
	}
	if got := testutil.ToFloat64(s.met.reloadErrors.WithLabelValues(p.CertFile)); got != 2 {
		t.Errorf("errors after a forced reload: %v; want 2", got)
	}
}

func TestReload(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	c, k := ca.issue(t, leafSpec{cn: "old", dns: []string{"rot.test"}})
	p := writePair(t, dir, "tls", c, k)
	s, err := New(Config{Certificates: []Pair{p}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(); err != nil {
		t.Fatalf("Reload of unchanged files: %v", err)
	}
	if n := testutil.ToFloat64(s.met.reloads); n != 0 {
		t.Errorf("reloads after an unchanged Reload: %v; want 0", n)
	}
	c2, _ := ca.issue(t, leafSpec{cn: "new", dns: []string{"rot.test"}})
	writeFile(t, p.CertFile, c2)
	if err := s.Reload(); !errors.Is(err, ErrKeyMismatch) {
		t.Fatalf("Reload with a mismatched key: got %v; want ErrKeyMismatch", err)
	}
	if cn := s.Certificates()[0].Leaf.Subject.CommonName; cn != "old" {
		t.Errorf("after a failed Reload: %q; want %q", cn, "old")
	}
	if err := os.Remove(p.KeyFile); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Reload with a deleted key: got %v; want fs.ErrNotExist", err)
	}
	c3, k3 := ca.issue(t, leafSpec{cn: "new", dns: []string{"rot.test"}})
	writePair(t, dir, "tls", c3, k3)
	if err := s.Reload(); err != nil {
		t.Fatalf("Reload with a good pair: %v", err)
	}
	if cn := s.Certificates()[0].Leaf.Subject.CommonName; cn != "new" {
		t.Errorf("after Reload: %q; want %q", cn, "new")
	}
	if n := testutil.ToFloat64(s.met.reloads); n != 1 {
		t.Errorf("sluice_tls_reloads_total = %v; want 1", n)
	}
}

func TestExpiryGauge(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	notAfter := time.Now().Add(48 * time.Hour).Truncate(time.Second)
	c, k := ca.issue(t, leafSpec{cn: "a", dns: []string{"a.test"}, notAfter: notAfter})
	p := writePair(t, dir, "tls", c, k)
	reg := prometheus.NewRegistry()
	s, err := New(Config{Certificates: []Pair{p}}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(s.met.expiry.WithLabelValues("a.test")); got != float64(notAfter.Unix()) {
		t.Errorf("expiry{name=a.test} = %v; want %v", got, notAfter.Unix())
	}
	c2, k2 := ca.issue(t, leafSpec{cn: "b", dns: []string{"b.test"}})
	writePair(t, dir, "tls", c2, k2)
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(s.met.expiry); n != 1 {
		t.Errorf("expiry series after renaming the certificate: %d; want 1 (old name removed)", n)
	}
	const want = `
# HELP sluice_tls_reloads_total Certificate pairs replaced after their files changed.
# TYPE sluice_tls_reloads_total counter
sluice_tls_reloads_total 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sluice_tls_reloads_total"); err != nil {
		t.Error(err)
	}
}

// The expiry gauge holds a Unix time, so its name ends in
// _timestamp_seconds; the old name carries the same value for one release.
func TestExpiryGaugeTimestampName(t *testing.T) {
	ca := newTestCA(t)
	notAfter := time.Now().Add(48 * time.Hour).Truncate(time.Second)
	c, k := ca.issue(t, leafSpec{cn: "a", dns: []string{"a.test"}, notAfter: notAfter})
	reg := prometheus.NewRegistry()
	if _, err := New(Config{Certificates: []Pair{writePair(t, t.TempDir(), "tls", c, k)}}, nil, reg); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"sluice_tls_cert_expiry_timestamp_seconds", "sluice_tls_cert_expiry_seconds"} {
		want := fmt.Sprintf("# HELP %s %s\n# TYPE %s gauge\n%s{name=\"a.test\"} %d\n", name,
			map[bool]string{true: "NotAfter of the served certificate as a Unix time, by primary name.",
				false: "Deprecated: use sluice_tls_cert_expiry_timestamp_seconds (same value)."}[name == "sluice_tls_cert_expiry_timestamp_seconds"],
			name, name, notAfter.Unix())
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), name); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestConcurrentHandshakesDuringReload(t *testing.T) {
	r := newRotation(t, t.TempDir(), -1, false)
	done := make(chan struct{})
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			for i := 0; i < 50; i++ {
				select {
				case <-done:
					errs <- nil
					return
				default:
				}
				c, err := dial(r.addr, "rot.test", r.ca.pool, nil)
				if err != nil {
					errs <- err
					return
				}
				c.Close()
			}
			errs <- nil
		}()
	}
	for i := range 10 {
		c, k := r.ca.issue(t, leafSpec{cn: "gen" + string(rune('0'+i)), dns: []string{"rot.test"}})
		writePair(t, filepath.Dir(r.pair.CertFile), "tls", c, k)
		_ = r.store.Reload() // may race the watcher's own reload; both are fine
	}
	close(done)
	for range 4 {
		if err := <-errs; err != nil {
			t.Errorf("handshake during reloads: %v", err)
		}
	}
	if cn := peerCN(t, r.addr, "rot.test"); cn != "gen9" {
		t.Errorf("after reloads: serving %q; want %q", cn, "gen9")
	}
}
