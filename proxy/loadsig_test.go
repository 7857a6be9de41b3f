package proxy_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/routing"
)

// fakeVLLM speaks exactly vLLM v0.11's load protocol
// (vllm/entrypoints/openai/api_server.py, orca_metrics.py): /metrics with
// the V1 engine's gauge names; a chat completion answered with an
// endpoint-load-metrics header only when the request carries
// endpoint-load-metrics-format TEXT or JSON (any case), only on a
// non-streamed success, and with num_requests_waiting and
// kv_cache_usage_perc only (no running count).
type fakeVLLM struct {
	srv      *httptest.Server
	waiting  atomic.Int64 // what the header reports
	served   atomic.Int64
	mu       sync.Mutex
	formats  []string // endpoint-load-metrics-format of each request
	scrapes  atomic.Int64
	metricsW float64 // what /metrics reports (stays put: the scrape is slow)
}

func newFakeVLLM(t *testing.T) *fakeVLLM {
	f := &fakeVLLM{}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeVLLM) serve(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		return
	case "/metrics":
		f.scrapes.Add(1)
		fmt.Fprintf(w, "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"+
			"# TYPE vllm:num_requests_running gauge\n"+
			"vllm:num_requests_running{engine=\"0\",model_name=\"sim-small\"} 0.0\n"+
			"# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"+
			"# TYPE vllm:num_requests_waiting gauge\n"+
			"vllm:num_requests_waiting{engine=\"0\",model_name=\"sim-small\"} %.1f\n"+
			"# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"+
			"# TYPE vllm:kv_cache_usage_perc gauge\n"+
			"vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"sim-small\"} 0.0\n", f.metricsW)
		return
	case "/v1/chat/completions":
	default:
		http.NotFound(w, r)
		return
	}
	io.Copy(io.Discard, r.Body)
	format := r.Header.Get("Endpoint-Load-Metrics-Format")
	f.mu.Lock()
	f.formats = append(f.formats, format)
	f.mu.Unlock()
	f.served.Add(1)
	wait := fmt.Sprintf("%d.0", f.waiting.Load())
	switch strings.ToLower(format) {
	case "text":
		w.Header().Set("Endpoint-Load-Metrics", "TEXT named_metrics.num_requests_waiting="+wait+", named_metrics.kv_cache_usage_perc=0.5")
	case "json":
		w.Header().Set("Endpoint-Load-Metrics", `JSON {"named_metrics": {"num_requests_waiting": `+wait+`, "kv_cache_usage_perc": 0.5}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{
		"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "sim-small",
		"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": "hi"}, "finish_reason": "stop"}},
		"usage":   map[string]any{"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
	})
}

// A backend speaking vLLM's protocol steers routing through its load
// header between scrapes: both backends' only scrape says idle, but one
// reports a deep queue in the header it sends because the edge asked for
// it, and least_queued sends the rest of the traffic to the other. On
// every listener.
func TestVLLMLoadHeaderSteersBetweenScrapes(t *testing.T) {
	for _, format := range []string{"", routing.LoadHeaderJSON} {
		for _, proto := range []string{"h1", "h2", "h3", "bridge"} {
			t.Run(proto+"/"+format, func(t *testing.T) {
				busy, idle := newFakeVLLM(t), newFakeVLLM(t)
				busy.waiting.Store(40)
				pc := poolOf(busy.srv.URL, idle.srv.URL)
				pc.ScrapeInterval, pc.StaleAfter = time.Hour, 2*time.Hour // one scrape, at start
				pc.LoadHeaderFormat = format
				e := startEdge(t, edgeOpts{pool: pc, start: true})
				waitFor(t, 5*time.Second, "first scrapes", func() bool {
					for _, b := range e.pools["p"].Backends() {
						if !b.Load(time.Now()).Known {
							return false
						}
					}
					return true
				})
				var c *http.Client
				url := e.https
				switch proto {
				case "h1":
					c, url = h1Client(), e.http
				case "h2":
					c = h2Client()
				case "h3":
					c, url = h3Client(t), e.h3
				}
				const n = 30
				body := `{"model":"sim-small","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
				if proto == "bridge" {
					ws := dialWS(t, wsURL(e), keyHeader())
					for i := range n {
						request(t, ws, fmt.Sprint(i), body)
						if f := readUntilTerminal(t, ws, 1); f[len(f)-1].Type != "done" {
							t.Fatalf("request %d over the bridge: %+v", i, f)
						}
					}
				}
				for i := range n {
					if proto == "bridge" {
						break
					}
					resp := post(t, c, url+"/v1/chat/completions", body,
						"Endpoint-Load-Metrics-Format", "BIN") // a client's own ask is not passed on
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
					}
					if h := resp.Header.Get("Endpoint-Load-Metrics"); h != "" {
						t.Fatalf("the backend's load report reached the client: %q", h)
					}
				}
				// Before the first header from busy, picks are a coin toss; after
				// it, busy scores 40 queued against idle's 0.
				if got := busy.served.Load(); got > 3 {
					t.Errorf("busy backend served %d of %d requests (idle %d); want the header to steer them away", got, n, idle.served.Load())
				}
				if s := busy.scrapes.Load() + idle.scrapes.Load(); s > 4 {
					t.Errorf("%d scrapes; the test wants the header, not scrapes, to steer", s)
				}
				want := "TEXT"
				if format == routing.LoadHeaderJSON {
					want = "JSON"
				}
				for _, f := range []*fakeVLLM{busy, idle} {
					f.mu.Lock()
					for _, got := range f.formats {
						if got != want {
							t.Errorf("backend got endpoint-load-metrics-format %q; want %q", got, want)
							break
						}
					}
					f.mu.Unlock()
				}
			})
		}
	}
}

// With load_header_format off, or for SGLang/TGI pools by default, the
// edge asks for nothing.
func TestLoadHeaderFormatOff(t *testing.T) {
	for _, pc := range []func(*routing.PoolConfig){
		func(pc *routing.PoolConfig) { pc.LoadHeaderFormat = routing.LoadHeaderOff },
		func(pc *routing.PoolConfig) { pc.Dialect = routing.DialectSGLang },
		func(pc *routing.PoolConfig) { pc.Dialect = routing.DialectTGI },
	} {
		f := newFakeVLLM(t)
		cfg := poolOf(f.srv.URL)
		pc(&cfg)
		e := startEdge(t, edgeOpts{pool: cfg})
		resp := post(t, h1Client(), e.http+"/v1/chat/completions",
			`{"model":"sim-small","messages":[{"role":"user","content":"hi"}]}`, "Endpoint-Load-Metrics-Format", "TEXT")
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		f.mu.Lock()
		if len(f.formats) != 1 || f.formats[0] != "" {
			t.Errorf("%+v: backend got formats %q; want none asked", cfg.LoadHeaderFormat+cfg.Dialect, f.formats)
		}
		f.mu.Unlock()
	}
}
