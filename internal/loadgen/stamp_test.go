package loadgen

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/gpusim"
)

func TestParseEmitNs(t *testing.T) {
	content := `"choices":[{"index":0,"delta":{"content":"a"}}]`
	tests := []struct {
		name    string
		data    string
		ns      int64
		ok      bool
		tokens  int
		wantErr bool
	}{
		{"simulator chunk", `{"id":"c","model":"m","sluice_emit_ns":1796230001375190619,` + content + `}`, 1796230001375190619, true, 1, false},
		{"first key", `{"sluice_emit_ns":5,` + content + `}`, 5, true, 1, false},
		{"zero", `{"sluice_emit_ns":0,` + content + `}`, 0, true, 1, false},
		{"padded placeholder", `{"sluice_emit_ns":   42 ,` + content + `}`, 42, true, 1, false},
		{"role chunk", `{"sluice_emit_ns":7,"choices":[{"delta":{"role":"assistant","content":""}}]}`, 7, true, 0, false},
		{"max int64", `{"sluice_emit_ns":9223372036854775807}`, 1<<63 - 1, true, 0, false},
		{"absent", `{` + content + `}`, 0, false, 1, false},
		{"nested, not top level", `{"choices":[{"delta":{"content":"a"},"sluice_emit_ns":5}]}`, 0, false, 1, false},
		{"other key with the prefix", `{"sluice_emit_ns_x":5,` + content + `}`, 0, false, 1, false},
		{"fraction", `{"sluice_emit_ns":1.5,` + content + `}`, 0, false, 1, false},
		{"exponent", `{"sluice_emit_ns":1e18,` + content + `}`, 0, false, 1, false},
		{"negative", `{"sluice_emit_ns":-3,` + content + `}`, 0, false, 1, false},
		{"string", `{"sluice_emit_ns":"123",` + content + `}`, 0, false, 1, false},
		{"null", `{"sluice_emit_ns":null,` + content + `}`, 0, false, 1, false},
		{"overflows int64", `{"sluice_emit_ns":9223372036854775808,` + content + `}`, 0, false, 1, false},
		{"20 digits", `{"sluice_emit_ns":12345678901234567890,` + content + `}`, 0, false, 1, false},
		{"leading zero is not JSON", `{"sluice_emit_ns":01,` + content + `}`, 0, false, 0, true},
		{"missing value", `{"sluice_emit_ns":,` + content + `}`, 0, false, 0, true},
		{"bare minus", `{"sluice_emit_ns":-,` + content + `}`, 0, false, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c chunk
			c.emitNs, c.hasEmit = 99, true // parse must reset them
			n, err := c.parse([]byte(tt.data))
			if (err != nil) != tt.wantErr {
				t.Fatalf("parse error %v; want error %v", err, tt.wantErr)
			}
			if n != tt.tokens || c.hasEmit != tt.ok || c.emitNs != tt.ns {
				t.Errorf("tokens %d, emit %d %v; want %d, %d %v", n, c.emitNs, c.hasEmit, tt.tokens, tt.ns, tt.ok)
			}
		})
	}
}

// TestTokenDelayRecording feeds known events through the stream state:
// only content events with a stamp give a sample, of arrival − emit.
func TestTokenDelayRecording(t *testing.T) {
	var res Result
	st := streamState{res: &res, start: time.Unix(100, 0)}
	at := func(ns int64) time.Time { return time.Unix(0, ns) }
	events := []struct {
		now  int64
		data string
	}{
		{200_000_000_000, `{"sluice_emit_ns":199999999000,"choices":[{"delta":{"role":"assistant","content":""}}]}`}, // role: no token
		{200_000_001_000, `{"sluice_emit_ns":200000000500,"choices":[{"delta":{"content":"a"}}]}`},                   // 500ns
		{200_000_002_000, `{"choices":[{"delta":{"content":"b"}}]}`},                                                 // no stamp
		{200_000_003_000, `{"sluice_emit_ns":"x","choices":[{"delta":{"content":"c"}}]}`},                            // ignored stamp
		{200_003_000_000, `{"sluice_emit_ns":200000000000,"choices":[{"text":"d"}]}`},                                // 3ms
		{200_004_000_000, `{"sluice_emit_ns":200004000000,"choices":[],"usage":{"completion_tokens":4}}`},            // usage: no token
	}
	for _, ev := range events {
		if err := st.event(at(ev.now), nil, []byte(ev.data)); err != nil {
			t.Fatalf("event %s: %v", ev.data, err)
		}
	}
	want := []time.Duration{500, 3 * time.Millisecond}
	if len(res.TokenDelay) != len(want) || res.TokenDelay[0] != want[0] || res.TokenDelay[1] != want[1] {
		t.Errorf("token delays %v; want %v", res.TokenDelay, want)
	}
	if len(res.ITL) != 3 {
		t.Errorf("itl %v; want 3 gaps (stamps do not change token counting)", res.ITL)
	}
}

// TestStampedEventAllocs: a stamped content event costs no allocation
// once the sample slices have room.
func TestStampedEventAllocs(t *testing.T) {
	res := Result{ITL: make([]time.Duration, 0, 1024), TokenDelay: make([]time.Duration, 0, 1024)}
	st := streamState{res: &res, start: time.Now()}
	data := []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"sim-small","sluice_emit_ns":1796230001375190619,"choices":[{"index":0,"delta":{"content":" the"},"logprobs":null,"finish_reason":null}]}`)
	now := time.Now()
	allocs := testing.AllocsPerRun(500, func() {
		if err := st.event(now, nil, data); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per stamped event; want 0", allocs)
	}
}

// startStampSim serves a simulator with stamped chunks and paced tokens on
// a loopback listener.
func startStampSim(t *testing.T) string {
	t.Helper()
	sim := gpusim.New(gpusim.Config{StampTokens: true, Pace: time.Millisecond, PrefillBase: -1, PrefillPerToken: -1})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sim.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("simulator: %v", err)
		}
		sim.Close()
	})
	return "http://" + ln.Addr().String()
}

func TestTokenDelayAgainstSimulator(t *testing.T) {
	cfg := small(startStampSim(t))
	cfg.Concurrency, cfg.Requests, cfg.IgnoreEOS = 4, 16, true
	rep := mustRun(t, cfg)
	tr := rep.Targets[0]
	if tr.Counts.OK != 16 {
		t.Fatalf("counts %+v; want 16 ok", tr.Counts)
	}
	received := 0
	for _, r := range rep.Results {
		if len(r.TokenDelay) != r.TokensOut || r.TokensOut != r.MaxTokens {
			t.Errorf("request %d: %d delays for %d tokens (max %d)", r.Seq, len(r.TokenDelay), r.TokensOut, r.MaxTokens)
		}
		for _, d := range r.TokenDelay {
			if d < 0 || d >= time.Second {
				t.Errorf("request %d: token delay %v outside [0, 1s)", r.Seq, d)
			}
		}
		received += r.TokensOut
	}
	if tr.TokenDelay.N != received || int64(received) != tr.OutputTokens {
		t.Errorf("token delay n %d; want the %d tokens received (output tokens %d)", tr.TokenDelay.N, received, tr.OutputTokens)
	}
	checkOrdered(t, "token delay", tr.TokenDelay)

	var tab bytes.Buffer
	if err := rep.WriteTable(&tab); err != nil || !strings.Contains(tab.String(), "token delay") {
		t.Errorf("table (err %v) lacks the token delay row:\n%s", err, tab.String())
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var decoded struct {
		Targets []struct {
			TokenDelay map[string]float64 `json:"token_delay"`
		} `json:"targets"`
	}
	if err := json.Unmarshal(js.Bytes(), &decoded); err != nil {
		t.Fatal(err)
	}
	if td := decoded.Targets[0].TokenDelay; int(td["n"]) != received || td["max_ms"] < td["p50_ms"] || len(td) != 5 {
		t.Errorf("json token_delay %v; want n %d and the four percentiles", td, received)
	}
	var c bytes.Buffer
	if err := rep.WriteCSV(&c); err != nil || !strings.Contains(c.String(), "token_delay_ms,n,"+strconv.Itoa(received)) {
		t.Errorf("csv (err %v) lacks token_delay_ms n %d:\n%s", err, received, c.String())
	}
	var rc bytes.Buffer
	if err := rep.WriteRequestsCSV(&rc); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&rc).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	head := rows[0]
	if head[len(head)-2] != "token_delay_n" || head[len(head)-1] != "token_delay_p50_ms" {
		t.Fatalf("requests csv header %v", head)
	}
	for _, row := range rows[1:] {
		if row[len(row)-2] != row[slices.Index(head, "tokens_out")] {
			t.Errorf("requests csv row %v: token_delay_n differs from tokens_out", row)
		}
	}
}

func TestTokenDelayCompare(t *testing.T) {
	cfg := small(startStampSim(t))
	cfg.Compare = startStampSim(t)
	cfg.Requests, cfg.Rounds, cfg.Concurrency = 8, 2, 2
	rep := mustRun(t, cfg)
	rows := map[string]CompareRow{}
	for _, r := range rep.Comparison.Rows {
		if r.Metric == "token_delay" {
			rows[r.Stat] = r
		}
	}
	tgt, base := rep.Targets[0].TokenDelay, rep.Targets[1].TokenDelay
	if len(rows) != 4 || tgt.N == 0 || base.N == 0 {
		t.Fatalf("token_delay rows %v, n %d and %d; want p50, p95, p99 and max of both", rows, tgt.N, base.N)
	}
	p99 := rows["p99"]
	if p99.TargetMs != ms(tgt.P99) || p99.BaselineMs != ms(base.P99) || p99.DeltaMs != p99.TargetMs-p99.BaselineMs {
		t.Errorf("p99 row %+v; target %v baseline %v", p99, tgt.P99, base.P99)
	}
	var tab bytes.Buffer
	_ = rep.WriteTable(&tab)
	if !strings.Contains(tab.String(), "token_delay") {
		t.Errorf("comparison table lacks token_delay:\n%s", tab.String())
	}
	// Unstamped targets: no token delay rows.
	plain := small(startH1(t, &sseServer{}))
	plain.Compare = startH1(t, &sseServer{})
	plain.Requests, plain.Rounds = 4, 2
	if rep := mustRun(t, plain); len(rep.Comparison.Rows) != 12 || rep.Targets[0].TokenDelay.N != 0 {
		t.Errorf("unstamped compare: %d rows, token delay n %d; want 12, 0", len(rep.Comparison.Rows), rep.Targets[0].TokenDelay.N)
	}
}

// TestRampIsWarmup: with -ramp every measured request started after the
// ramp, in every round of a comparison.
func TestRampIsWarmup(t *testing.T) {
	srv := &sseServer{Interval: time.Millisecond}
	cfg := small(startH1(t, srv))
	cfg.Compare = startH1(t, &sseServer{Interval: time.Millisecond})
	cfg.Concurrency, cfg.Ramp, cfg.Duration, cfg.Rounds = 8, 150*time.Millisecond, 400*time.Millisecond, 2
	rep := mustRun(t, cfg)
	if rep.Settings.Ramp != "150ms" {
		t.Errorf("settings ramp %q", rep.Settings.Ramp)
	}
	if len(rep.Results) == 0 {
		t.Fatal("no measured requests")
	}
	for _, r := range rep.Results {
		if r.Start < cfg.Ramp {
			t.Errorf("target %d seq %d started %v into its round, inside the %v ramp", r.Target, r.Seq, r.Start, cfg.Ramp)
		}
	}
	if total := srv.requests.Load(); int(total) <= rep.Targets[0].Counts.Sent {
		t.Errorf("server saw %d requests, all measured (%d): the ramp sent none", total, rep.Targets[0].Counts.Sent)
	}
	bad := small("http://127.0.0.1:1")
	bad.Rate, bad.Ramp = 5, time.Second
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "ramp") {
		t.Errorf("ramp with an open loop: %v; want an error", err)
	}
}

func TestFDWarning(t *testing.T) {
	emfile := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("socket", syscall.EMFILE)}
	if msg := errText(emfile); !strings.Contains(msg, "too many open files") || !strings.Contains(msg, "ulimit -n") {
		t.Errorf("EMFILE message %q; want the cause and the ulimit hint", msg)
	}
	if msg := errText(errors.New("boom")); msg != "boom" {
		t.Errorf("plain error message %q", msg)
	}
	limit, ok := openFileLimit()
	if !ok {
		t.Skip("no open-file limit here")
	}
	cfg := small("http://127.0.0.1:1").withDefaults()
	cfg.Concurrency = int(limit) + 1
	if w := fdWarning(cfg); !strings.Contains(w, "ulimit -n") {
		t.Errorf("concurrency above the limit %d: warning %q", limit, w)
	}
	cfg.Concurrency = 1
	if w := fdWarning(cfg); w != "" {
		t.Errorf("concurrency 1: warning %q", w)
	}
	cfg.Concurrency, cfg.Protocol = int(limit)+1, H2C
	if w := fdWarning(cfg); w != "" {
		t.Errorf("h2c multiplexes: warning %q", w)
	}
}
