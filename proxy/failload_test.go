package proxy_test

import (
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/routing"
)

// TestPickAvoidsBackendAbortingMidStream (issue 20): two healthy
// simulators serving long streams and one that aborts every stream after
// three tokens (gpusim DieAfterTokens), behind real listeners. Passive
// ejection is set out of reach (eject_after 1000) so that the pick score
// alone is under test: the failing backend frees its slots early and,
// without the failure penalty, looked the least loaded (28 of 40 picks in
// the issue). With it, the failing backend gets at most 8 of 40 picks.
func TestPickAvoidsBackendAbortingMidStream(t *testing.T) {
	good := fastSim()
	good.MaxBatch, good.KVCacheTokens = 64, 1<<20
	bad := good
	bad.DieAfterTokens = 3
	_, url1 := startSim(t, good)
	_, url2 := startSim(t, good)
	badSim, badURL := startSim(t, bad)
	pool := poolOf(url1, url2, badURL)
	pool.EjectAfter = 1000
	pool.Policy = routing.PolicyLeastQueued
	e := startEdge(t, edgeOpts{pool: pool})

	const n = 40
	var wg sync.WaitGroup
	c := h2cClient()
	for i := range n {
		resp := post(t, c, e.http+"/v1/chat/completions", chatBody(`"max_tokens":200`))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
		wg.Go(func() { // ends with the stream: the good ones take ~2 s
			defer resp.Body.Close()
			io.Copy(io.Discard, resp.Body)
		})
		time.Sleep(20 * time.Millisecond) // picks spread over 0.8 s: the bad streams end in between
	}
	wg.Wait()
	got := badSim.Stats()
	if got.Total == 0 || got.Failed != got.Total {
		t.Fatalf("bad backend stats %+v; want every stream it got aborted", got)
	}
	if got.Total > 8 {
		t.Fatalf("the backend that aborts every stream got %d of %d picks; want at most 8", got.Total, n)
	}
	t.Logf("the backend that aborts every stream got %d of %d picks", got.Total, n)
}
