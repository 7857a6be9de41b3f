package listen_test

import (
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/sluice-proxy/sluice/proxy/listen"
)

// TestReusePortShares: with SLUICE_REUSEPORT=1 two servers bind the same
// cleartext port and the kernel hands connections to both; without it
// the second bind fails.
func TestReusePortShares(t *testing.T) {
	serve := func(name string, addr string) (*listen.Server, error) {
		s := &listen.Server{HTTPAddr: addr, HTTPServer: listen.HTTPServerSluice,
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, name) })}
		if err := s.Listen(); err != nil {
			return nil, err
		}
		go s.Serve()
		t.Cleanup(func() { s.Close() })
		return s, nil
	}
	t.Run("off", func(t *testing.T) {
		a, err := serve("a", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := serve("b", a.Addr(listen.ListenerHTTP)); err == nil {
			t.Fatal("a second server bound the same port without SLUICE_REUSEPORT")
		}
	})
	t.Run("on", func(t *testing.T) {
		t.Setenv("SLUICE_REUSEPORT", "1")
		a, err := serve("a", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := a.Addr(listen.ListenerHTTP)
		if _, err := serve("b", addr); err != nil {
			t.Fatalf("second server on %s: %v", addr, err)
		}
		seen := map[string]int{}
		for i := 0; i < 64 && len(seen) < 2; i++ {
			tr := &http.Transport{DisableKeepAlives: true}
			resp, err := (&http.Client{Transport: tr}).Get(fmt.Sprintf("http://%s/", addr))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			seen[string(b)]++
		}
		if seen["a"] == 0 || seen["b"] == 0 {
			t.Fatalf("answers by server %v; want both to take connections", seen)
		}
	})
}
