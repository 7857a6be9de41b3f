package proxy_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/internal/gpusim"
	"github.com/sluice-proxy/sluice/routing"
)

// turnBody is conversation c's streamed chat request at turn turns (each
// turn ~500 bytes more history, as a chat client appends), asking for
// usage.
func turnBody(model string, c, turns int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `{"model":%q,"stream":true,"stream_options":{"include_usage":true},"max_tokens":2,"messages":[`, model)
	b.WriteString(`{"role":"system","content":"You are terse."}`)
	for k := range turns {
		fmt.Fprintf(&b, `,{"role":"user","content":"c%d t%d %s"}`, c, k, strings.Repeat("words and more ", 30))
	}
	return b.String() + "]}"
}

// cachedOf reads prompt_tokens_details.cached_tokens from a stream's
// usage event.
func cachedOf(t *testing.T, evs []sseEvent) int {
	t.Helper()
	for _, ev := range evs {
		var u struct {
			Usage *struct {
				Details *struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(ev.data), &u) == nil && u.Usage != nil && u.Usage.Details != nil {
			return u.Usage.Details.Cached
		}
	}
	t.Fatal("no usage event with prompt_tokens_details")
	return 0
}

// runConversations sends 7 conversations (not a multiple of the 4
// backends, so that round_robin does not bring turns back by chance) of 4 turns through an edge whose
// pool has policy, over HTTP/1.1 and HTTP/2 by turn, and returns the share
// of later turns' prompt tokens the simulators found in their prefix
// caches.
func runConversations(t *testing.T, policy string, routes []testRoute, model string) float64 {
	cfg := fastSim()
	cfg.PrefixCacheBlocks = 10000
	pool := routing.PoolConfig{Name: "p", Policy: policy, Dialect: routing.DialectNone}
	for range 4 {
		_, url := startSim(t, cfg)
		pool.Backends = append(pool.Backends, routing.BackendConfig{URL: url})
	}
	e := startEdge(t, edgeOpts{pool: pool, routes: routes})
	cached, later := 0, 0
	for turn := 1; turn <= 4; turn++ {
		for c := range 7 {
			client, base := h1Client(), e.http
			if turn%2 == 0 {
				client, base = h2Client(), e.https
			}
			resp := post(t, client, base+"/v1/chat/completions", turnBody(model, c, turn))
			evs, done := readEvents(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !done {
				t.Fatalf("%s turn %d: status %d, done %v", policy, turn, resp.StatusCode, done)
			}
			if turn > 1 {
				cached += cachedOf(t, evs)
				later += len(turnBody(model, c, turn-1)) / 4 // about the history's tokens
			}
		}
	}
	return float64(cached) / float64(later)
}

// Under prefix_aware the edge hashes each request's messages (the span the
// intake found, no copy) and sends a conversation's turns to the backend
// that served its earlier turns, so the simulators find most of each
// history in their prefix caches; round_robin scatters the turns and finds
// far less. Also with an alias rewriting the model before the messages
// (the prompt's span follows the edit).
func TestPrefixAwareKeepsConversationsOnTheirBackend(t *testing.T) {
	aware := runConversations(t, routing.PolicyPrefixAware, nil, "sim-small")
	rr := runConversations(t, routing.PolicyRoundRobin, nil, "sim-small")
	aliased := runConversations(t, routing.PolicyPrefixAware, []testRoute{{RouteConfig: routing.RouteConfig{Pool: "p",
		ServedModels: map[string]string{"a-much-longer-public-model-name": "sim-small"}}}}, "a-much-longer-public-model-name")
	t.Logf("cached share of later turns: prefix_aware %.2f, round_robin %.2f, prefix_aware with alias %.2f", aware, rr, aliased)
	if aware < 0.6 || aliased < 0.6 {
		t.Errorf("prefix_aware found %.2f (aliased %.2f) of the histories cached; want most", aware, aliased)
	}
	if rr > aware/2 {
		t.Errorf("round_robin found %.2f cached, prefix_aware %.2f; want round_robin far lower", rr, aware)
	}
}

// A pool's session header pins a tenant's session to one backend over
// HTTP/1.1 and HTTP/2; requests without it spread.
func TestSessionHeaderPinsBackend(t *testing.T) {
	pool := routing.PoolConfig{Name: "p", Dialect: routing.DialectNone,
		Affinity: routing.AffinityConfig{SessionHeader: "X-Conversation"}}
	var sims []*gpusim.Sim
	for range 4 {
		sim, url := startSim(t, fastSim())
		sims = append(sims, sim)
		pool.Backends = append(pool.Backends, routing.BackendConfig{URL: url})
	}
	e := startEdge(t, edgeOpts{pool: pool})
	send := func(client *http.Client, base string, hdr ...string) {
		resp := post(t, client, base+"/v1/chat/completions", chatBody(""), hdr...)
		_, done := readEvents(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !done {
			t.Fatalf("status %d, done %v", resp.StatusCode, done)
		}
	}
	for i := range 12 {
		if i%2 == 0 {
			send(h1Client(), e.http, "X-Conversation", "conv-42")
		} else {
			send(h2Client(), e.https, "X-Conversation", "conv-42")
		}
	}
	busy := 0
	for _, s := range sims {
		if n := s.Stats().Total; n == 12 {
			busy++
		} else if n != 0 {
			t.Fatalf("session spread over backends: %d on one", n)
		}
	}
	if busy != 1 {
		t.Fatalf("session on %d backends; want 1", busy)
	}
	for range 12 {
		send(h1Client(), e.http)
	}
	spread := 0
	for _, s := range sims {
		if s.Stats().Total > 0 {
			spread++
		}
	}
	if spread < 3 {
		t.Errorf("requests without a session used %d of 4 backends", spread)
	}
}
