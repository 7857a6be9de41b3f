package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/proxy"
	"github.com/sluice-proxy/sluice/routing"
)

// recPicker is a pool's picker that records what the pipeline tells each
// attempt.
type recPicker struct {
	p   *routing.Pool
	mu  sync.Mutex
	log []string
}

func (r *recPicker) Acquire(ctx context.Context, want routing.Want) (proxy.Attempt, error) {
	a, err := r.p.Acquire(ctx, want)
	if err != nil {
		return nil, err
	}
	r.add(fmt.Sprintf("acquire %s tried=%d queue=%v", a.Backend().URL.Host, len(want.Tried), want.Queue))
	return &recAttempt{Attempt: a, r: r}, nil
}

func (r *recPicker) add(s string) {
	r.mu.Lock()
	r.log = append(r.log, s)
	r.mu.Unlock()
}

func (r *recPicker) calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.log...)
}

type recAttempt struct {
	*routing.Attempt
	r        *recPicker
	progress int
}

func (a *recAttempt) Observe(h http.Header, t time.Time) {
	a.r.add("observe " + a.Backend().URL.Host)
	a.Attempt.Observe(h, t)
}

func (a *recAttempt) Progress(t time.Time) {
	a.progress++
	a.Attempt.Progress(t)
}

func (a *recAttempt) End(o routing.Outcome) {
	a.r.add(fmt.Sprintf("end %s outcome=%d progress>0=%v", a.Backend().URL.Host, o, a.progress > 0))
	a.Attempt.End(o)
}

// The pipeline speaks to routing through one attempt per backend tried:
// the first queues, a retry names the backend tried, every attempt ends
// exactly once (the failed one as Failed, before the retry starts), and
// the failure is logged once at warn with the request id, the backend and
// the error.
func TestAttemptProtocol(t *testing.T) {
	bad := fastSim()
	bad.FailBeforeFirst = 1
	_, badURL := startSim(t, bad)
	_, goodURL := startSim(t, fastSim())
	pool := poolOf(badURL, goodURL)
	pool.Policy = routing.PolicyRoundRobin
	pool.EjectAfter = 1000
	var rec *recPicker
	errLog := &logBuffer{}
	e := startEdge(t, edgeOpts{pool: pool, errLog: errLog,
		pickers: func(p *routing.Pool) proxy.Picker { rec = &recPicker{p: p}; return rec }})
	badHost, goodHost := strings.TrimPrefix(badURL, "http://"), strings.TrimPrefix(goodURL, "http://")
	var id string
	for i := 0; i < 2 && id == ""; i++ { // round robin: one of two requests starts on the bad backend
		before := len(rec.calls())
		resp := post(t, h1Client(), e.http+"/v1/chat/completions", chatBody(""))
		_, done := readEvents(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !done {
			t.Fatalf("status %d, done=%v; want a full stream after the retry", resp.StatusCode, done)
		}
		calls := rec.calls()[before:]
		if !strings.Contains(calls[0], badHost) {
			continue
		}
		id = resp.Header.Get("X-Request-Id")
		want := []string{
			"acquire " + badHost + " tried=0 queue=true",
			"observe " + badHost,
			"end " + badHost + " outcome=1 progress>0=false",
			"acquire " + goodHost + " tried=1 queue=false",
			"observe " + goodHost,
			"end " + goodHost + " outcome=0 progress>0=true",
		}
		if strings.Join(calls, "\n") != strings.Join(want, "\n") {
			t.Fatalf("calls:\n%s\nwant:\n%s", strings.Join(calls, "\n"), strings.Join(want, "\n"))
		}
	}
	if id == "" {
		t.Fatal("no request started on the failing backend; the test proves nothing")
	}
	lines := errLog.lines("upstream attempt failed", id)
	if len(lines) != 1 || !strings.Contains(lines[0], badHost) || !strings.Contains(lines[0], "level=WARN") {
		t.Fatalf("warn lines for %s: %q; want one naming backend %s", id, lines, badHost)
	}
	for _, b := range e.pools["p"].Backends() {
		if n := b.InFlight(); n != 0 {
			t.Fatalf("backend %s counts %d requests after all ended", b.URL.Host, n)
		}
	}
}
