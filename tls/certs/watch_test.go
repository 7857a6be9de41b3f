package certs

import "testing"

func TestRunDevCertOnly(t *testing.T) {
	s, err := New(Config{DevCert: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if dirs := s.WatchDirs(); len(dirs) != 0 {
		t.Errorf("WatchDirs with only a dev certificate: %v; want none", dirs)
	}
	runStore(t, s, false) // must start and stop cleanly with nothing to watch
	if err := s.Reload(); err != nil {
		t.Errorf("Reload with only a dev certificate: %v", err)
	}
	if err := s.Check(); err != nil {
		t.Errorf("Check with only a dev certificate: %v", err)
	}
}
