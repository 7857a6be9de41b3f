package certs

import (
	"crypto/tls"
	"fmt"
	"testing"
)

func BenchmarkGetCertificate(b *testing.B) {
	ca := newTestCA(b)
	dir := b.TempDir()
	var pairs []Pair
	for i := range 100 {
		c, k := ca.issue(b, leafSpec{cn: fmt.Sprint(i), dns: []string{fmt.Sprintf("h%d.example.com", i)}})
		pairs = append(pairs, writePair(b, dir, fmt.Sprint(i), c, k))
	}
	c, k := ca.issue(b, leafSpec{cn: "w", dns: []string{"*.wild.example.com"}})
	pairs = append(pairs, writePair(b, dir, "w", c, k))
	s, err := New(Config{Certificates: pairs}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"h50.example.com", "x.wild.example.com", "unknown.test"} {
		b.Run(name, func(b *testing.B) {
			hello := &tls.ClientHelloInfo{ServerName: name}
			for b.Loop() {
				if _, err := s.GetCertificate(hello); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
