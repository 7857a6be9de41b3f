package proxy_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/routing"
)

// Parts of a generated chat.completion body: head, content ('a' repeated),
// tail with the usage at the end, as OpenAI and vLLM v0.11
// (protocol.py ChatCompletionResponse) write it.
const (
	hugeHead = `{"id":"chatcmpl-x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"`
	hugeTail = `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":654321,"total_tokens":654328}}`
)

// writeGenerated writes a chat.completion of exactly size bytes in 32KiB
// pieces (never held whole), flushing each; with cl it declares its
// Content-Length. It stops early when the client is gone.
func writeGenerated(w http.ResponseWriter, size int64, cl bool) {
	w.Header().Set("Content-Type", "application/json")
	if cl {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	}
	rc := http.NewResponseController(w)
	io.WriteString(w, hugeHead)
	piece := bytes.Repeat([]byte("a"), 32<<10)
	for n := size - int64(len(hugeHead)+len(hugeTail)); n > 0; {
		p := piece[:min(n, int64(len(piece)))]
		if _, err := w.Write(p); err != nil {
			return
		}
		rc.Flush()
		n -= int64(len(p))
	}
	io.WriteString(w, hugeTail)
}

// tailReader counts what a client reads and keeps the last bytes.
type tailReader struct {
	n    int64
	tail []byte
}

func (c *tailReader) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	c.tail = append(c.tail, p...)
	if len(c.tail) > 4<<10 {
		c.tail = append(c.tail[:0], c.tail[len(c.tail)-1024:]...)
	}
	return len(p), nil
}

// TestAttackHugeNonStreamedResponse: a backend answers a non-streamed
// request with a 200MiB body (generated, usage at the end). It used to be
// read whole before the first byte reached the client (up to
// max_response_bytes); now it is streamed through: the client gets every
// byte, the process's heap in use (sampled during the transfer; backend,
// edge and client share the process) stays within 16MiB of what it was
// before, and the tenant is settled from the usage at the end.
func TestAttackHugeNonStreamedResponse(t *testing.T) {
	const size = 200 << 20
	const bound = 16 << 20
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		writeGenerated(w, size, r.URL.Query().Get("cl") == "1")
	}))
	defer backend.Close()
	for _, pc := range []struct {
		name string
		cl   bool
	}{{"h1", true}, {"h2", false}} {
		t.Run(pc.name, func(t *testing.T) {
			lim := &settleRecorder{Local: limiter.NewLocal(1), settled: make(chan limiter.Usage, 1)}
			e := startEdge(t, edgeOpts{pool: poolOf(backend.URL), limiter: lim,
				limits: limiter.Limits{TokensPerMinute: 100 << 20},
				proxy:  proxy.Config{MaxResponseBytes: 256 << 20}})
			client, url := h1Client(), e.http
			if pc.name == "h2" {
				client, url = h2Client(), e.https
			}
			url += "/v1/chat/completions"
			if pc.cl {
				url += "?cl=1"
			}
			var ms runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&ms)
			base := ms.HeapInuse
			var peak atomic.Uint64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
						var ms runtime.MemStats
						runtime.ReadMemStats(&ms)
						if ms.HeapInuse > peak.Load() {
							peak.Store(ms.HeapInuse)
						}
					}
				}
			})
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			resp := postCtx(t, ctx, client, url, `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`)
			var got tailReader
			_, err := io.CopyBuffer(&got, resp.Body, make([]byte, 32<<10))
			resp.Body.Close()
			close(stop)
			wg.Wait()
			if resp.StatusCode != 200 || err != nil {
				t.Fatalf("status %d, read error %v after %d bytes", resp.StatusCode, err, got.n)
			}
			if got.n != size || !bytes.HasSuffix(got.tail, []byte(hugeTail)) {
				t.Fatalf("client read %d bytes ending %q; want %d ending with the usage", got.n, got.tail[max(len(got.tail)-120, 0):], size)
			}
			if pc.cl && resp.ContentLength != size {
				t.Errorf("Content-Length %d; want the backend's %d", resp.ContentLength, size)
			}
			if grew := int64(peak.Load()) - int64(base); grew > bound {
				t.Errorf("heap in use grew by %d MiB during the transfer; want at most %d MiB", grew>>20, bound>>20)
			} else {
				t.Logf("heap in use grew by at most %.1f MiB while %d MiB went through", float64(grew)/(1<<20), size>>20)
			}
			select {
			case u := <-lim.settled:
				if u.InputTokens != 7 || u.OutputTokens != 654321 {
					t.Fatalf("settled %+v; want the usage at the body's end (7 in, 654321 out)", u)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("nothing settled")
			}
		})
	}
}

// TestAttackResponseBuffering: non-streamed responses used to be read whole
// (each up to max_response_bytes), so many large ones at once grew the
// process; a node-wide budget then refused them past response_memory_bytes.
// Now a response holds one 32KiB window whatever its size, and the budget
// bounds windows × responses: with 64KiB, a 300KiB body passes whole, two
// responses being streamed hold the budget, a third gets 503
// response_memory_exhausted, and the next passes once they end.
func TestAttackResponseBuffering(t *testing.T) {
	big := `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("a", 300<<10) + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
	small := `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
	release := make(chan struct{})
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		b, _ := io.ReadAll(r.Body)
		switch {
		case strings.Contains(string(b), "big"):
			io.WriteString(w, big)
		case strings.Contains(string(b), "hold"):
			io.WriteString(w, big[:100<<10]) // past the window: the edge commits
			http.NewResponseController(w).Flush()
			<-release
			io.WriteString(w, big[100<<10:])
		default:
			io.WriteString(w, small)
		}
	}))
	defer backend.Close()
	defer close(release)
	e := startEdge(t, edgeOpts{pool: poolOf(backend.URL), proxy: proxy.Config{ResponseMemoryBytes: 64 << 10}})
	ask := func(what string) *http.Response {
		return post(t, h1Client(), e.http+"/v1/chat/completions",
			`{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"`+what+`"}]}`)
	}
	read := func(resp *http.Response) (int, string) {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	if st, b := read(ask("big")); st != http.StatusOK || b != big {
		t.Fatalf("a 300KiB response with 64KiB of response memory: %d, %d bytes; want 200 and the body intact", st, len(b))
	}
	held := []*http.Response{ask("hold"), ask("hold")}
	for _, resp := range held {
		if _, err := io.ReadFull(resp.Body, make([]byte, 1<<10)); resp.StatusCode != 200 || err != nil {
			t.Fatalf("held response: %d, %v", resp.StatusCode, err)
		}
	}
	if st, b := read(ask("small")); st != http.StatusServiceUnavailable || !strings.Contains(b, "response_memory_exhausted") {
		t.Fatalf("a third response while two hold the 64KiB: %d %.200s; want 503 response_memory_exhausted", st, b)
	}
	release <- struct{}{}
	release <- struct{}{}
	for _, resp := range held {
		if st, b := read(resp); st != 200 || b != big[1<<10:] {
			t.Fatalf("held response finished: %d, %d more bytes; want the rest of the body", st, len(b))
		}
	}
	waitFor(t, 2*time.Second, "windows released", func() bool {
		st, _ := read(ask("small"))
		return st == http.StatusOK
	})
}

// TestNonStreamedBodyCut: a backend that cuts a non-streamed body after
// the edge committed it (with a Content-Length, and chunked) leaves the
// client with a broken body: an error on read over HTTP/1.1 (the
// connection is closed), HTTP/2 and HTTP/3 (the stream is reset), never a
// clean-looking short body; the attempt ends as Failed and is not retried.
func TestNonStreamedBodyCut(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("cl") == "1" {
			w.Header().Set("Content-Length", strconv.Itoa(1<<20))
		}
		io.WriteString(w, hugeHead+strings.Repeat("a", 100<<10))
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler) // the connection is closed mid-body
	}))
	backend.Config.ErrorLog = nil
	defer backend.Close()
	for _, pc := range []struct{ name, query string }{{"h1-length", "?cl=1"}, {"h1-chunked", ""}, {"h2-length", "?cl=1"}, {"h2-chunked", ""}, {"h3-length", "?cl=1"}} {
		t.Run(pc.name, func(t *testing.T) {
			var rec *recPicker
			pool := poolOf(backend.URL)
			pool.EjectAfter = 1000
			e := startEdge(t, edgeOpts{pool: pool,
				pickers: func(p *routing.Pool) proxy.Picker { rec = &recPicker{p: p}; return rec }})
			client, url := h1Client(), e.http
			switch pc.name[:2] {
			case "h2":
				client, url = h2Client(), e.https
			case "h3":
				client, url = h3Client(t), e.h3
			}
			req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions"+pc.query, strings.NewReader(chatBody("")))
			req.Header.Set("Authorization", "Bearer "+testKey)
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			switch {
			case err != nil && pc.name[:2] == "h3" && strings.Contains(err.Error(), "H3_INTERNAL_ERROR"):
				// A QUIC RESET_STREAM lets the receiver drop everything
				// not yet read (RFC 9000 §3.2), the HEADERS frame too
				// when the reset overtakes it: the client sees the reset
				// before any response. That is still a broken exchange,
				// never a clean short body.
			case err != nil:
				t.Fatalf("request: %v", err)
			default:
				n, err := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("status %d; want 200 (the body had started)", resp.StatusCode)
				}
				if err == nil {
					t.Fatalf("the client read %d bytes and a clean end; want a read error (connection closed or stream reset)", n)
				}
				if n < 100<<10 && pc.name[:2] != "h3" { // a QUIC reset may drop data not yet read
					t.Fatalf("the client got %d bytes before the cut; want the %d the backend sent", n, len(hugeHead)+100<<10)
				}
			}
			waitFor(t, 2*time.Second, "attempt ended", func() bool {
				c := rec.calls()
				return len(c) > 0 && strings.HasPrefix(c[len(c)-1], "end ")
			})
			calls := rec.calls()
			if len(calls) != 3 || !strings.Contains(calls[2], "outcome=1") {
				t.Fatalf("attempt calls %q; want one attempt ended as Failed (outcome=1), no retry", calls)
			}
		})
	}
}

// TestNonStreamedClientGone: a client that leaves in the middle of a long
// non-streamed body frees the backend's slot and the request is settled
// (as without usage: the prompt estimate, no output).
func TestNonStreamedClientGone(t *testing.T) {
	backendDone := make(chan struct{}, 2)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		writeGenerated(w, 64<<20, true)
		backendDone <- struct{}{}
	}))
	defer backend.Close()
	for _, pc := range []string{"h1", "h2"} {
		t.Run(pc, func(t *testing.T) {
			lim := &settleRecorder{Local: limiter.NewLocal(1), settled: make(chan limiter.Usage, 1)}
			e := startEdge(t, edgeOpts{pool: poolOf(backend.URL), limiter: lim,
				limits: limiter.Limits{TokensPerMinute: 1 << 20}})
			client, url := h1Client(), e.http
			if pc == "h2" {
				client, url = h2Client(), e.https
			}
			resp := post(t, client, url+"/v1/chat/completions", chatBody(""))
			if _, err := io.ReadFull(resp.Body, make([]byte, 256<<10)); err != nil || resp.StatusCode != 200 {
				t.Fatalf("status %d, %v", resp.StatusCode, err)
			}
			resp.Body.Close() // leaves mid-body
			select {
			case u := <-lim.settled:
				if u.OutputTokens != 0 {
					t.Errorf("settled %+v; want no output (no usage was read)", u)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("nothing settled after the client left")
			}
			select {
			case <-backendDone:
			case <-time.After(5 * time.Second):
				t.Fatal("the backend was not released (its request still runs)")
			}
			waitFor(t, 2*time.Second, "backend slot freed", func() bool {
				return e.pools["p"].Backends()[0].InFlight() == 0
			})
		})
	}
}

// TestNonStreamedLongHeaders: a body streamed through keeps the headers a
// whole one had (the backend's Content-Length, Server-Timing, X-Request-Id
// and X-Sluice-Request-Id before the body), and its end-of-body timing
// (decode) comes as a Server-Timing trailer to clients that ask for
// trailers with "TE: trailers" (on HTTP/1.1 only with a chunked body: Go
// sends no trailer after a Content-Length body).
func TestNonStreamedLongHeaders(t *testing.T) {
	const size = 1 << 20
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		writeGenerated(w, size, r.URL.Query().Get("cl") == "1")
	}))
	defer backend.Close()
	e := startEdge(t, edgeOpts{pool: poolOf(backend.URL)})
	for _, pc := range []string{"h1", "h2", "h1-chunked-te"} {
		t.Run(pc, func(t *testing.T) {
			client, url, query := h1Client(), e.http, "?cl=1"
			var hdr []string
			switch pc {
			case "h2":
				client, url, hdr = h2Client(), e.https, []string{"TE", "trailers"}
			case "h1-chunked-te": // HTTP/1.1 trailers need a chunked body
				query, hdr = "", []string{"TE", "trailers"}
			}
			resp := post(t, client, url+"/v1/chat/completions"+query, chatBody(""), hdr...)
			n, err := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || err != nil || n != size {
				t.Fatalf("status %d, %d bytes, %v", resp.StatusCode, n, err)
			}
			if want := int64(size); query == "" {
				want = -1
				if resp.ContentLength != want {
					t.Errorf("Content-Length %d; want none (the backend sent none)", resp.ContentLength)
				}
			} else if resp.ContentLength != want {
				t.Errorf("Content-Length %d; want the backend's %d", resp.ContentLength, want)
			}
			for _, k := range []string{"Server-Timing", "X-Request-Id", "X-Sluice-Request-Id"} {
				if resp.Header.Get(k) == "" {
					t.Errorf("no %s header", k)
				}
			}
			if st := resp.Header.Get("Server-Timing"); !strings.Contains(st, "ttft;dur=") {
				t.Errorf("Server-Timing %q; want the stages up to the first bytes", st)
			}
			if pc != "h1" {
				if tr := resp.Trailer.Get("Server-Timing"); !strings.Contains(tr, "decode;dur=") {
					t.Errorf("Server-Timing trailer %q; want the decode time", tr)
				}
			}
		})
	}
}

// TestNonStreamedBackendErrorPassed: a backend's 4xx answer is passed on
// with its status and error body as before: whole with its exact
// Content-Length when short, streamed through intact when longer than the
// window; no usage is read from it (the request settles as without usage).
func TestNonStreamedBackendErrorPassed(t *testing.T) {
	short := `{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":"bad"},"usage":{"prompt_tokens":9,"completion_tokens":9}}`
	long := `{"error":{"message":"` + strings.Repeat("x", 100<<10) + `","type":"invalid_request_error","param":null,"code":"bad"},"usage":{"prompt_tokens":9,"completion_tokens":9}}`
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(string(b), "long") {
			w.Header().Set("Content-Length", strconv.Itoa(len(long)))
		}
		w.WriteHeader(http.StatusUnprocessableEntity)
		if strings.Contains(string(b), "long") {
			io.WriteString(w, long)
			return
		}
		io.WriteString(w, short)
	}))
	defer backend.Close()
	for _, c := range []struct{ name, want string }{{"short", short}, {"long", long}} {
		t.Run(c.name, func(t *testing.T) {
			lim := &settleRecorder{Local: limiter.NewLocal(1), settled: make(chan limiter.Usage, 1)}
			e := startEdge(t, edgeOpts{pool: poolOf(backend.URL), limiter: lim, limits: limiter.Limits{TokensPerMinute: 1 << 20}})
			resp := post(t, h2Client(), e.https+"/v1/chat/completions",
				`{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"`+c.name+`"}]}`)
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusUnprocessableEntity || string(b) != c.want {
				t.Fatalf("%d, %d bytes, %v; want 422 and the backend's error body", resp.StatusCode, len(b), err)
			}
			if resp.ContentLength != int64(len(c.want)) {
				t.Errorf("Content-Length %d; want %d", resp.ContentLength, len(c.want))
			}
			select {
			case u := <-lim.settled:
				if u.OutputTokens != 0 || u.InputTokens == 9 {
					t.Errorf("settled %+v; the error body's usage must not be read", u)
				}
			case <-time.After(3 * time.Second):
				t.Fatal("nothing settled")
			}
		})
	}
}

// TestNonStreamedCutBeforeWindowRetried: a backend that cuts a body
// within its first 32KiB (the head read before the commit) is still
// retried on another backend, and the client gets the other's whole body.
func TestNonStreamedCutBeforeWindowRetried(t *testing.T) {
	cutter := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Length", strconv.Itoa(1<<20))
		io.WriteString(w, hugeHead+strings.Repeat("a", 10<<10))
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	}))
	defer cutter.Close()
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		writeGenerated(w, 256<<10, true)
	}))
	defer good.Close()
	pool := poolOf(cutter.URL, good.URL)
	pool.Policy = routing.PolicyRoundRobin
	pool.EjectAfter = 1000
	e := startEdge(t, edgeOpts{pool: pool})
	for i := 0; i < 4; i++ { // round robin: some start on the cutter
		resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || err != nil || n != 256<<10 {
			t.Fatalf("request %d: %d, %d bytes, %v; want the good backend's whole body after a retry", i, resp.StatusCode, n, err)
		}
	}
}
