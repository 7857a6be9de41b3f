package proxy

import (
	"net/http"
	"testing"
)

// TestFieldDropsMatchSets: copyHeader's one lookup drops in each direction
// exactly the fields the three documented sets name (hop-by-hop in both,
// clientOwned from requests, backendOwned from responses), and the rest
// is copied.
func TestFieldDropsMatchSets(t *testing.T) {
	keys := []string{"Content-Type", "Accept", "User-Agent", "X-Custom", "Openai-Organization"}
	for _, set := range []map[string]bool{hopHeaders, clientOwned, backendOwned} {
		for k := range set {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		src := http.Header{k: {"v"}}
		req, resp := http.Header{}, http.Header{}
		copyRequestHeader(req, src)
		copyResponseHeader(resp, src)
		_, gotReq := req[k]
		_, gotResp := resp[k]
		if want := !hopHeaders[k] && !clientOwned[k]; gotReq != want {
			t.Errorf("request field %q copied %v, want %v", k, gotReq, want)
		}
		if want := !hopHeaders[k] && !backendOwned[k]; gotResp != want {
			t.Errorf("response field %q copied %v, want %v", k, gotResp, want)
		}
	}
}
