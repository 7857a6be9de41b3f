package proxy_test

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/redistest"
	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/proxy"
)

// chunk is a typical OpenAI stream event (one token).
const chunk = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"sim-small","choices":[{"index":0,"delta":{"content":" token"},"finish_reason":null}]}` + "\n\n"

// floodBackend streams as many events as the request's "n" query asks for,
// flushing each, as fast as the connection takes them.
type floodBackend struct{}

func (floodBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.Atoi(r.URL.Query().Get("n"))
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	ev := []byte(chunk)
	for i := 0; i < n; i++ {
		if _, err := w.Write(ev); err != nil {
			return
		}
		rc.Flush()
	}
	w.Write([]byte("data: [DONE]\n\n"))
}

// readStream counts the events of an SSE body.
func readStream(b *testing.B, resp *http.Response) int {
	defer resp.Body.Close()
	br := bufio.NewReaderSize(resp.Body, 32<<10)
	n := 0
	for {
		line, err := br.ReadSlice('\n')
		if bytes.HasPrefix(line, []byte("data: {")) {
			n++
		}
		if err != nil {
			return n
		}
	}
}

// BenchmarkRelay measures relaying one SSE event: an op is one event. The
// direct case is the same backend without Sluice; the difference in ns/op
// and allocs/op is Sluice's cost per event.
func BenchmarkRelay(b *testing.B) {
	srv := httptest.NewServer(floodBackend{})
	defer srv.Close()
	e := startEdge(b, edgeOpts{pool: poolOf(srv.URL)})
	cases := []struct {
		name, url string
		client    *http.Client
		auth      bool
	}{
		{"direct", srv.URL, h1Client(), false},
		{"sluice-h1", e.http, h1Client(), true},
		{"sluice-h2c", e.http, h2cClient(), true},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.ResetTimer()
			resp := post(b, tc.client, tc.url+"/v1/chat/completions?n="+strconv.Itoa(b.N), chatBody(""))
			if got := readStream(b, resp); got != b.N {
				b.Fatalf("got %d events; want %d", got, b.N)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// pacedBackend sends one event every interval, each carrying its sequence
// number, and records when it was written so the reader can compute the
// delivery delay (both ends share this process's monotonic clock).
type pacedBackend struct {
	interval time.Duration
	mu       sync.Mutex
	sent     []time.Time
}

func (p *pacedBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.Atoi(r.URL.Query().Get("n"))
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for i := 0; i < n; i++ {
		<-t.C
		ev := `data: {"choices":[{"delta":{"content":"t"}}],"seq":` + strconv.Itoa(i) + "}\n\n"
		p.mu.Lock()
		p.sent = append(p.sent, time.Now())
		p.mu.Unlock()
		w.Write([]byte(ev))
		rc.Flush()
	}
	w.Write([]byte("data: [DONE]\n\n"))
}

// BenchmarkEventDelay measures the delay from the backend flushing an event
// to the client reading it, at one event per millisecond: direct and through
// Sluice in the same run. It reports the P50 and P99 delay; compare the
// cases (ratio, or Sluice minus direct) rather than absolute figures.
func BenchmarkEventDelay(b *testing.B) {
	for _, name := range []string{"direct", "sluice-h1", "sluice-h2c"} {
		b.Run(name, func(b *testing.B) {
			be := &pacedBackend{interval: time.Millisecond}
			srv := httptest.NewServer(be)
			defer srv.Close()
			url, client := srv.URL, h1Client()
			if name != "direct" {
				e := startEdge(b, edgeOpts{pool: poolOf(srv.URL)})
				url = e.http
				if name == "sluice-h2c" {
					client = h2cClient()
				}
			}
			b.ResetTimer()
			resp := post(b, client, url+"/v1/chat/completions?n="+strconv.Itoa(b.N), chatBody(""))
			delays := make([]time.Duration, 0, b.N)
			br := bufio.NewReader(resp.Body)
			for {
				line, err := br.ReadSlice('\n')
				if i := bytes.Index(line, []byte(`"seq":`)); i >= 0 {
					now := time.Now()
					seq, _ := strconv.Atoi(string(bytes.TrimRight(line[i+6:], "}\n")))
					be.mu.Lock()
					if seq < len(be.sent) {
						delays = append(delays, now.Sub(be.sent[seq]))
					}
					be.mu.Unlock()
				}
				if err != nil {
					break
				}
			}
			resp.Body.Close()
			if len(delays) == 0 {
				b.Fatal("no events")
			}
			slices.Sort(delays)
			b.ReportMetric(float64(delays[len(delays)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(delays[len(delays)*99/100].Microseconds()), "p99-µs")
		})
	}
}

// BenchmarkAdmissionTTFT measures the client-observed time to the first
// event of a one-event stream, with no limiter, the local limiter and the
// Redis limiter (a private redis-server on loopback): an op is one request.
// Compare the P50/P99 between cases; the difference is the admission cost.
func BenchmarkAdmissionTTFT(b *testing.B) {
	srv := httptest.NewServer(floodBackend{})
	defer srv.Close()
	limits := limiter.Limits{MaxConcurrency: 1000, TokensPerMinute: 1 << 40, RequestsPerMinute: 1 << 40}
	for _, name := range []string{"none", "local", "redis"} {
		b.Run(name, func(b *testing.B) {
			var lim proxy.Limiter
			switch name {
			case "local":
				lim = limiter.NewLocal(1)
			case "redis":
				rs := redistest.Start(b)
				s, err := limiter.NewFromConfig(limiter.RedisConfig{Addrs: []string{rs.Addr()}}.WithDefaults(), nil, nil)
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				lim = s
			}
			e := startEdge(b, edgeOpts{pool: poolOf(srv.URL), limiter: lim, limits: limits})
			client := h1Client()
			url := e.http + "/v1/chat/completions?n=1"
			ttfts := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				start := time.Now()
				resp := post(b, client, url, chatBody(""))
				br := bufio.NewReader(resp.Body)
				br.ReadSlice('\n')
				ttfts = append(ttfts, time.Since(start))
				io.Copy(io.Discard, br)
				resp.Body.Close()
			}
			slices.Sort(ttfts)
			b.ReportMetric(float64(ttfts[len(ttfts)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(ttfts[len(ttfts)*99/100].Microseconds()), "p99-µs")
		})
	}
}

// postN sends n small chat completions to url+"/v1/chat/completions" from
// workers goroutines sharing client, and reports a failure or a status
// other than 200 (as name's). contentType is set when not empty.
func postN(b testing.TB, client *http.Client, url, name, body, contentType string, workers, n int) {
	var wg sync.WaitGroup
	var next atomic.Int64
	for range workers {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+testKey)
				if contentType != "" {
					req.Header.Set("Content-Type", contentType)
				}
				resp, err := client.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Errorf("%s: status %d", name, resp.StatusCode)
					return
				}
			}
		})
	}
	wg.Wait()
}
