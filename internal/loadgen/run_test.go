package loadgen

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// small is a short, fixed-length workload for runs against test servers.
func small(target string) Config {
	return Config{
		Target:       target,
		Workload:     WorkloadCustom,
		PromptTokens: Dist{Kind: Fixed, A: 8},
		OutputTokens: Dist{Kind: Uniform, A: 4, B: 8},
		Timeout:      20 * time.Second,
		Drain:        20 * time.Second,
	}
}

func TestClosedLoopH1(t *testing.T) {
	srv := &sseServer{Interval: time.Millisecond, Trailer: true, Comment: true}
	cfg := small(startH1(t, srv))
	cfg.Concurrency, cfg.Requests = 4, 24
	rep := mustRun(t, cfg)

	if len(rep.Targets) != 1 || rep.Comparison != nil {
		t.Fatalf("%d targets, comparison %v; want 1, nil", len(rep.Targets), rep.Comparison)
	}
	tr := rep.Targets[0]
	if tr.Counts.Sent != 24 || tr.Counts.OK != 24 || len(rep.Results) != 24 || srv.requests.Load() != 24 {
		t.Fatalf("counts %+v, %d results, server saw %d; want 24 ok", tr.Counts, len(rep.Results), srv.requests.Load())
	}
	var wantTokens, wantITL int
	for _, r := range rep.Results {
		wantTokens += r.MaxTokens
		wantITL += r.MaxTokens - 1
		if !r.Done || r.Class != ClassOK || r.Status != 200 || r.TokensOut != r.MaxTokens || !strings.HasPrefix(r.RequestID, "req-") {
			t.Errorf("result %+v; want done, ok, %d tokens", r, r.MaxTokens)
		}
	}
	if tr.OutputTokens != int64(wantTokens) || tr.ITL.N != wantITL || tr.TTFT.N != 24 || tr.E2E.N != 24 {
		t.Errorf("tokens %d (want %d), itl n %d (want %d), ttft n %d, e2e n %d",
			tr.OutputTokens, wantTokens, tr.ITL.N, wantITL, tr.TTFT.N, tr.E2E.N)
	}
	for name, p := range map[string]Percentiles{"ttft": tr.TTFT, "itl": tr.ITL, "e2e": tr.E2E} {
		checkOrdered(t, name, p)
	}
	if tr.ITL.P50 < time.Millisecond {
		t.Errorf("itl p50 %v below the server's 1ms token interval", tr.ITL.P50)
	}
	if tr.E2E.P50 < tr.TTFT.P50 || tr.RequestsPerSec <= 0 || tr.OutputTokensPerSec <= 0 || tr.Wall <= 0 {
		t.Errorf("e2e p50 %v ttft p50 %v rps %v tps %v wall %v", tr.E2E.P50, tr.TTFT.P50, tr.RequestsPerSec, tr.OutputTokensPerSec, tr.Wall)
	}
	checkStages(t, tr.Stages, "network", "queue", "prefill", "ttft", "edge", "decode", "itl-p50", "tokens")
	if proto, _ := srv.lastProto.Load().(string); proto != "HTTP/1.1" {
		t.Errorf("server saw %s; want HTTP/1.1", proto)
	}
	checkOutputs(t, rep)
}

// checkStages asserts the named Server-Timing stages are in the report,
// each with a sample per request.
func checkStages(t *testing.T, stages []Stage, names ...string) {
	t.Helper()
	have := map[string]Stage{}
	for _, s := range stages {
		have[s.Name] = s
	}
	for _, n := range names {
		s, ok := have[n]
		if !ok || s.N == 0 {
			t.Errorf("stage %q missing from %+v", n, stages)
			continue
		}
		if !(s.P50 <= s.P95 && s.P95 <= s.P99 && s.P99 <= s.Max) {
			t.Errorf("stage %q out of order: %+v", n, s)
		}
	}
	if s := have["network"]; s.N > 0 && s.Unit != "ms" {
		t.Errorf("network unit %q", s.Unit)
	}
	if s := have["tokens"]; s.N > 0 && s.Unit != "" {
		t.Errorf("tokens unit %q; want a count", s.Unit)
	}
}

// checkOutputs writes the table, JSON and both CSVs and checks they parse.
func checkOutputs(t *testing.T, rep *Report) {
	t.Helper()
	var tab bytes.Buffer
	if err := rep.WriteTable(&tab); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ttft", "itl", "e2e", "TRUNCATED", "req/s", "server-timing", "network"} {
		if !strings.Contains(tab.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tab.String())
		}
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var decoded struct {
		Targets []struct {
			Counts map[string]int `json:"counts"`
			TTFT   struct {
				N     int     `json:"n"`
				P95ms float64 `json:"p95_ms"`
			} `json:"ttft"`
			Stages []Stage `json:"stages"`
		} `json:"targets"`
	}
	if err := json.Unmarshal(js.Bytes(), &decoded); err != nil {
		t.Fatalf("json: %v\n%s", err, js.String())
	}
	if len(decoded.Targets) == 0 || decoded.Targets[0].TTFT.N == 0 || decoded.Targets[0].TTFT.P95ms <= 0 {
		t.Errorf("json targets: %+v", decoded.Targets)
	}
	var c bytes.Buffer
	if err := rep.WriteCSV(&c); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&c).ReadAll()
	if err != nil || len(rows) < 20 || len(rows[0]) != 5 {
		t.Fatalf("csv: %v, %d rows", err, len(rows))
	}
	var rc bytes.Buffer
	if err := rep.WriteRequestsCSV(&rc); err != nil {
		t.Fatal(err)
	}
	rrows, err := csv.NewReader(&rc).ReadAll()
	if err != nil || len(rrows) != len(rep.Results)+1 {
		t.Fatalf("requests csv: %v, %d rows for %d results", err, len(rrows), len(rep.Results))
	}
}

func TestOpenLoop(t *testing.T) {
	srv := &sseServer{Interval: time.Millisecond}
	cfg := small(startH1(t, srv))
	cfg.Rate, cfg.Duration, cfg.Requests = 40, 2*time.Second, 30
	rep := mustRun(t, cfg)
	tr := rep.Targets[0]
	if rep.Settings.Arrival != "open" || rep.Settings.Rate != 40 {
		t.Errorf("settings %+v", rep.Settings)
	}
	if tr.Counts.Sent == 0 || tr.Counts.Sent > 30 || tr.Counts.OK != tr.Counts.Sent {
		t.Errorf("counts %+v; want 1..30 sent, all ok", tr.Counts)
	}
	if tr.DispatchLag.N != tr.Counts.Sent {
		t.Errorf("dispatch lag n %d; want one per request", tr.DispatchLag.N)
	}
	checkOrdered(t, "ttft", tr.TTFT)
	checkOrdered(t, "lag", tr.DispatchLag)
	// Arrivals are spread over time, not sent at once.
	var first, last time.Duration = time.Hour, 0
	for _, r := range rep.Results {
		first, last = min(first, r.Start), max(last, r.Start)
	}
	if last <= first {
		t.Errorf("all requests started at once (%v..%v)", first, last)
	}
}

func TestTruncatedStreamsCounted(t *testing.T) {
	srv := &sseServer{DieAfter: 2}
	cfg := small(startH1(t, srv))
	cfg.Concurrency, cfg.Requests = 2, 6
	tr := mustRun(t, cfg).Targets[0]
	if tr.Counts.Truncated != 6 || tr.Counts.OK != 0 || tr.Counts.StreamErrors != 0 {
		t.Errorf("counts %+v; want 6 truncated", tr.Counts)
	}
	if tr.TTFT.N != 6 || tr.E2E.N != 0 {
		t.Errorf("ttft n %d e2e n %d; want ttft of the cut streams, no e2e", tr.TTFT.N, tr.E2E.N)
	}
	if len(tr.Errors) == 0 || tr.Errors[0].Class != ClassTruncated {
		t.Errorf("errors %+v", tr.Errors)
	}
}

func TestStreamErrorIsNotTruncation(t *testing.T) {
	srv := &sseServer{ErrorAfter: 2}
	cfg := small(startH1(t, srv))
	cfg.Requests = 3
	tr := mustRun(t, cfg).Targets[0]
	if tr.Counts.StreamErrors != 3 || tr.Counts.Truncated != 0 {
		t.Errorf("counts %+v; want 3 stream errors, 0 truncated", tr.Counts)
	}
}

func TestStatusCounts(t *testing.T) {
	for _, tt := range []struct {
		status int
		get    func(Counts) int
	}{
		{429, func(c Counts) int { return c.Status429 }},
		{503, func(c Counts) int { return c.Status5xx }},
		{401, func(c Counts) int { return c.Status4xx }},
	} {
		srv := &sseServer{Status: tt.status}
		cfg := small(startH1(t, srv))
		cfg.Requests = 3
		tr := mustRun(t, cfg).Targets[0]
		if tt.get(tr.Counts) != 3 || tr.Counts.OK != 0 {
			t.Errorf("status %d: counts %+v", tt.status, tr.Counts)
		}
		if len(tr.Errors) == 0 || !strings.Contains(tr.Errors[0].Msg, "from test server") {
			t.Errorf("status %d: error body not reported: %+v", tt.status, tr.Errors)
		}
	}
}

func TestTimeoutIsNotTruncation(t *testing.T) {
	srv := &sseServer{Interval: 2 * time.Second}
	cfg := small(startH1(t, srv))
	cfg.Requests, cfg.Timeout = 2, 100*time.Millisecond
	tr := mustRun(t, cfg).Targets[0]
	if tr.Counts.Errors != 2 || tr.Counts.Truncated != 0 || tr.Errors[0].Class != ClassTimeout {
		t.Errorf("counts %+v errors %+v; want 2 timeouts", tr.Counts, tr.Errors)
	}
}

func TestDrainCancelsAtTheEnd(t *testing.T) {
	srv := &sseServer{Interval: time.Second}
	cfg := small(startH1(t, srv))
	cfg.Duration, cfg.Drain, cfg.Concurrency = 100*time.Millisecond, 100*time.Millisecond, 2
	start := time.Now()
	tr := mustRun(t, cfg).Targets[0]
	if tr.Counts.Canceled != 2 || tr.Counts.Truncated != 0 {
		t.Errorf("counts %+v; want the 2 streams in flight canceled", tr.Counts)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("run took %v despite a 100ms duration and drain", took)
	}
}

func TestConnectErrors(t *testing.T) {
	cfg := small(closedURL(t))
	cfg.Requests = 3
	tr := mustRun(t, cfg).Targets[0]
	if tr.Counts.Errors != 3 || tr.Errors[0].Class != ClassConnect {
		t.Errorf("counts %+v errors %+v; want 3 connect errors", tr.Counts, tr.Errors)
	}
}

// closedURL is the URL of a loopback port that was listening a moment ago.
func closedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

// syncBuffer is a bytes.Buffer safe for concurrent writes and reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestWarmupExcluded(t *testing.T) {
	srv := &sseServer{Interval: time.Millisecond}
	cfg := small(startH1(t, srv))
	cfg.Warmup, cfg.Requests = 150*time.Millisecond, 5
	rep := mustRun(t, cfg)
	tr := rep.Targets[0]
	if tr.Counts.Sent != 5 || len(rep.Results) != 5 {
		t.Errorf("measured %d (%d results); want 5", tr.Counts.Sent, len(rep.Results))
	}
	for _, r := range rep.Results {
		if r.Warmup {
			t.Error("a warm-up request is in the results")
		}
	}
	if n := srv.requests.Load(); n <= 5 {
		t.Errorf("server saw %d requests; want the warm-up ones too", n)
	}
}

func TestNonStreamed(t *testing.T) {
	srv := &sseServer{}
	cfg := small(startH1(t, srv))
	cfg.NoStream, cfg.Requests = true, 4
	rep := mustRun(t, cfg)
	tr := rep.Targets[0]
	if tr.Counts.OK != 4 || tr.ITL.N != 0 || tr.TTFT.N != 4 || tr.TTFT != tr.E2E {
		t.Errorf("counts %+v itl %+v ttft %+v e2e %+v; want ttft == e2e, no itl", tr.Counts, tr.ITL, tr.TTFT, tr.E2E)
	}
	for _, r := range rep.Results {
		if r.TokensOut != r.MaxTokens {
			t.Errorf("tokens %d; want usage %d", r.TokensOut, r.MaxTokens)
		}
	}
}

func TestProtocols(t *testing.T) {
	cert := newTestCert(t)
	tests := []struct {
		name      string
		proto     Protocol
		start     func(*sseServer) string
		mod       func(*Config)
		wantProto string
	}{
		{"h2c", H2C, func(s *sseServer) string { return startH2C(t, s) }, nil, "HTTP/2.0"},
		{"h2 with CA file", H2, func(s *sseServer) string { return startH2(t, s, cert) },
			func(c *Config) { c.CAFile = cert.caFile }, "HTTP/2.0"},
		{"h1 over TLS with pin", H1, func(s *sseServer) string { return startH2(t, s, cert) },
			func(c *Config) { c.PinSHA256 = cert.pin }, "HTTP/1.1"},
		{"h3 with CA file", H3, func(s *sseServer) string { return startH3(t, s, cert) },
			func(c *Config) { c.CAFile = cert.caFile }, "HTTP/3.0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := &sseServer{Interval: time.Millisecond, Trailer: true}
			cfg := small(tt.start(srv))
			cfg.Protocol, cfg.Concurrency, cfg.Requests = tt.proto, 3, 9
			if tt.mod != nil {
				tt.mod(&cfg)
			}
			tr := mustRun(t, cfg).Targets[0]
			if tr.Counts.OK != 9 {
				t.Fatalf("counts %+v errors %+v", tr.Counts, tr.Errors)
			}
			if got, _ := srv.lastProto.Load().(string); got != tt.wantProto {
				t.Errorf("server saw %s; want %s", got, tt.wantProto)
			}
			checkStages(t, tr.Stages, "network", "queue", "decode") // decode is the trailer

			// The interval lets the client read the headers first: a QUIC
			// reset discards data the client has not read yet.
			cut := &sseServer{DieAfter: 2, Interval: 5 * time.Millisecond}
			cfg.Target = tt.start(cut)
			cfg.Requests = 4
			tr = mustRun(t, cfg).Targets[0]
			if tr.Counts.Truncated != 4 || tr.Counts.OK != 0 {
				t.Errorf("cut streams: counts %+v errors %+v; want 4 truncated", tr.Counts, tr.Errors)
			}
		})
	}
}

func TestTLSFailures(t *testing.T) {
	cert := newTestCert(t)
	srv := &sseServer{}
	url := startH2(t, srv, cert)
	for _, tt := range []struct {
		name string
		mod  func(*Config)
	}{
		{"unknown CA", func(*Config) {}},
		{"wrong pin", func(c *Config) { c.PinSHA256 = strings.Repeat("A", 43) + "=" }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := small(url)
			cfg.Protocol, cfg.Requests = H2, 2
			tt.mod(&cfg)
			tr := mustRun(t, cfg).Targets[0]
			if tr.Counts.Errors != 2 || tr.Errors[0].Class != ClassTLS {
				t.Errorf("counts %+v errors %+v; want 2 tls errors", tr.Counts, tr.Errors)
			}
		})
	}
	if srv.requests.Load() != 0 {
		t.Errorf("server answered %d requests over unverified TLS", srv.requests.Load())
	}
}

func TestCompare(t *testing.T) {
	slow := &sseServer{Interval: 20 * time.Millisecond}
	fast := &sseServer{}
	cfg := small(startH1(t, slow))
	cfg.Compare = startH1(t, fast)
	cfg.Requests, cfg.Rounds, cfg.Concurrency = 8, 2, 2
	cfg.PIDs = []int{os.Getpid()}
	rep := mustRun(t, cfg)
	if len(rep.Targets) != 2 || rep.Comparison == nil {
		t.Fatalf("%d targets, comparison %v", len(rep.Targets), rep.Comparison)
	}
	tgt, base := rep.Targets[0], rep.Targets[1]
	if tgt.Role != "target" || base.Role != "baseline" || tgt.Counts.OK != 8 || base.Counts.OK != 8 {
		t.Fatalf("targets %s %+v / %s %+v", tgt.Role, tgt.Counts, base.Role, base.Counts)
	}
	if slow.requests.Load() != 8 || fast.requests.Load() != 8 {
		t.Errorf("servers saw %d and %d; want 8 each", slow.requests.Load(), fast.requests.Load())
	}
	if len(rep.Comparison.Rows) != 12 {
		t.Errorf("%d comparison rows; want 12", len(rep.Comparison.Rows))
	}
	for _, r := range rep.Comparison.Rows {
		if r.Metric == "itl" && r.Stat == "p50" && (r.TargetMs < 20 || r.DeltaMs <= 0 || r.Ratio <= 1) {
			t.Errorf("itl p50 row %+v; want the slow target above the fast baseline", r)
		}
	}
	// Same seq numbers on both: the same request bodies.
	seqs := map[int]map[int64]bool{0: {}, 1: {}}
	for _, r := range rep.Results {
		seqs[r.Target][r.Seq] = true
	}
	for s := range seqs[0] {
		if !seqs[1][s] {
			t.Errorf("seq %d sent to the target only", s)
		}
	}
	if len(tgt.CPU) != 1 || tgt.CPU[0].PID != os.Getpid() || tgt.CPU[0].Err != "" {
		t.Errorf("cpu %+v", tgt.CPU)
	}
	checkOutputs(t, rep)
}

func TestRunInterrupted(t *testing.T) {
	srv := &sseServer{Interval: 10 * time.Millisecond}
	cfg := small(startH1(t, srv))
	cfg.Duration, cfg.Concurrency = time.Minute, 2
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	rep, err := Run(ctx, cfg, nil)
	if !errors.Is(err, context.DeadlineExceeded) || rep == nil {
		t.Fatalf("Run = %v, %v; want a report and the context error", rep, err)
	}
	if rep.Targets[0].Counts.Sent == 0 {
		t.Error("no requests measured before the interruption")
	}
}

func TestProgressLine(t *testing.T) {
	srv := &sseServer{Interval: 5 * time.Millisecond}
	cfg := small(startH1(t, srv))
	cfg.Duration = 1200 * time.Millisecond
	var buf syncBuffer
	if _, err := Run(context.Background(), cfg, &buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.Contains(out, "sent ") || !strings.Contains(out, "tok/s") || strings.Contains(out, "\r") {
		t.Errorf("progress output %q; want plain lines with counts", out)
	}
}

// TestNoKeepAlive: with NoKeepAlive the target's client opens a connection
// per request; the baseline's keeps its connections.
func TestNoKeepAlive(t *testing.T) {
	count := func(s *sseServer) (string, *atomic.Int32) {
		var n atomic.Int32
		srv := httptest.NewUnstartedServer(s)
		srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				n.Add(1)
			}
		}
		srv.Start()
		t.Cleanup(srv.Close)
		return srv.URL, &n
	}
	tu, tn := count(&sseServer{})
	bu, bn := count(&sseServer{})
	cfg := small(tu)
	cfg.Compare, cfg.NoKeepAlive = bu, true
	cfg.Requests, cfg.Rounds, cfg.Concurrency = 8, 2, 1
	rep := mustRun(t, cfg)
	if rep.Targets[0].Counts.OK != 8 || rep.Targets[1].Counts.OK != 8 {
		t.Fatalf("counts %+v / %+v", rep.Targets[0].Counts, rep.Targets[1].Counts)
	}
	if got := tn.Load(); got != 8 {
		t.Errorf("target saw %d connections for 8 requests; want 8 (one each)", got)
	}
	if got := bn.Load(); got > 2 {
		t.Errorf("baseline saw %d connections for 8 requests one at a time; want them kept alive", got)
	}
}
