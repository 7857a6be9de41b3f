package proxy_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestClientGoneBeforeHead: a client who leaves while its attempt waits
// for the backend's response head cancels the attempt at once, which
// closes the backend connection (the attempt's context closes h1up's
// connection itself: attemptCtx, h1up.ConnCanceler), and frees the slot.
func TestClientGoneBeforeHead(t *testing.T) {
	arrived := make(chan struct{}, 4)
	gone := make(chan struct{}, 4)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // net/http watches the connection once the body is read
		arrived <- struct{}{}
		select {
		case <-r.Context().Done(): // the proxy closed the connection
			gone <- struct{}{}
		case <-time.After(10 * time.Second):
		}
	}))
	defer backend.Close()
	e := startEdge(t, edgeOpts{pool: poolOf(backend.URL)})
	for _, tc := range []struct {
		name   string
		client *http.Client
		base   string
	}{{"h1", h1Client(), e.http}, {"h2", h2Client(), e.https}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, tc.base+"/v1/chat/completions",
					strings.NewReader(chatBody("")))
				req.Header.Set("Authorization", "Bearer "+testKey)
				req.Header.Set("Content-Type", "application/json")
				resp, err := tc.client.Do(req)
				if err == nil {
					resp.Body.Close()
				}
				errc <- err
			}()
			select {
			case <-arrived:
			case <-time.After(5 * time.Second):
				t.Fatal("the request did not reach the backend")
			}
			cancel()
			<-errc
			select {
			case <-gone:
			case <-time.After(5 * time.Second):
				t.Fatal("the backend's connection was not closed after the client left")
			}
			waitFor(t, 2*time.Second, "backend slot freed", func() bool {
				return e.pools["p"].Backends()[0].InFlight() == 0
			})
		})
	}
}
