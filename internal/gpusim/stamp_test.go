package gpusim

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// emitOf returns the chunk's sluice_emit_ns and whether it has one; it
// fails the test when the field is there but not an integer.
func emitOf(t *testing.T, data string) (int64, bool) {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(data), &m); err != nil {
		t.Fatalf("chunk %s: %v", data, err)
	}
	raw, ok := m[EmitField]
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		t.Fatalf("chunk %s: %s is not an integer: %v", data, EmitField, err)
	}
	return v, true
}

func TestStampTokens(t *testing.T) {
	for _, pace := range []time.Duration{0, time.Millisecond} {
		cfg := fast()
		cfg.StampTokens, cfg.Pace = true, pace
		_, url := startSim(t, cfg)
		for _, tc := range []struct{ path, body string }{
			{"/v1/chat/completions", chatBody(6, true, true)},
			{"/v1/completions", `{"prompt":"hello","max_tokens":6,"stream":true}`},
		} {
			before := time.Now().UnixNano()
			resp := post(t, context.Background(), url, tc.path, tc.body)
			evs, done, err := readEvents(t, resp.Body)
			resp.Body.Close()
			after := time.Now().UnixNano()
			if err != nil || !done {
				t.Fatalf("pace %v %s: done=%v err=%v", pace, tc.path, done, err)
			}
			prev := int64(0)
			for i, ev := range evs {
				ns, ok := emitOf(t, ev.data)
				if !ok {
					t.Fatalf("pace %v %s event %d has no %s: %s", pace, tc.path, i, EmitField, ev.data)
				}
				if ns < before || ns > after || ns < prev {
					t.Errorf("pace %v %s event %d: emit %d not in [%d, %d] or before the previous %d",
						pace, tc.path, i, ns, before, after, prev)
				}
				prev = ns
			}
			first, _ := emitOf(t, evs[0].data)
			if prev <= first {
				t.Errorf("pace %v %s: emit times do not increase over the stream (%d … %d)", pace, tc.path, first, prev)
			}
		}
	}
}

func TestNoStampByDefault(t *testing.T) {
	_, url := startSim(t, fast())
	resp := post(t, context.Background(), url, "/v1/chat/completions", chatBody(4, true, true))
	evs, done, err := readEvents(t, resp.Body)
	resp.Body.Close()
	if err != nil || !done || len(evs) == 0 {
		t.Fatalf("done=%v err=%v events %d", done, err, len(evs))
	}
	for _, ev := range evs {
		if strings.Contains(ev.data, EmitField) {
			t.Errorf("chunk %s carries %s with stamp_tokens off", ev.data, EmitField)
		}
		decodeChunk(t, ev.data) // unknown fields rejected
	}
}

// TestStampCoalescedWrite: tokens held back by a stall go out in one
// write; every one of them carries the same, filled-in emit time.
func TestStampCoalescedWrite(t *testing.T) {
	cfg := fast()
	cfg.StampTokens = true
	_, url := startSim(t, cfg)
	resp := post(t, context.Background(), url, "/v1/chat/completions", chatBody(8, true, false),
		HeaderStallAfter, "1", HeaderStallFor, "100ms")
	evs, done, err := readEvents(t, resp.Body)
	resp.Body.Close()
	if err != nil || !done || len(evs) != 10 { // role, 8 tokens, finish
		t.Fatalf("done=%v err=%v events %d", done, err, len(evs))
	}
	stamps := map[int64]int{}
	for _, ev := range evs {
		ns, ok := emitOf(t, ev.data)
		if !ok || ns <= 0 {
			t.Fatalf("chunk %s: no emit time", ev.data)
		}
		stamps[ns]++
	}
	most := 0
	for _, n := range stamps {
		most = max(most, n)
	}
	if most < 3 {
		t.Errorf("no write carried several tokens (stamps %v); the stall should have coalesced them", stamps)
	}
}

func TestRendererStampPlaceholders(t *testing.T) {
	j := &job{chat: true, includeUsage: true, id: "chatcmpl-x", created: 7, seed: 3}
	rd := newRenderer("m", j, true)
	rd.role()
	rd.token(0)
	rd.token(1)
	rd.finish("length")
	rd.usageChunk(2, 2, -1)
	rd.stampAll(1234)
	events := bytes.Split(bytes.TrimSuffix(rd.buf, []byte("\n\n")), []byte("\n\n"))
	if len(events) != 5 || len(rd.stamps) != 0 {
		t.Fatalf("%d events, %d stamps pending: %q", len(events), len(rd.stamps), rd.buf)
	}
	for _, ev := range events {
		data, ok := bytes.CutPrefix(ev, []byte("data: "))
		if !ok || !json.Valid(data) {
			t.Fatalf("event %q is not data: JSON", ev)
		}
		if ns, ok := emitOf(t, string(data)); !ok || ns != 1234 {
			t.Errorf("event %s: emit %d, %v; want 1234", data, ns, ok)
		}
	}
	off := newRenderer("m", j, false)
	off.token(0)
	if bytes.Contains(off.buf, []byte(EmitField)) {
		t.Errorf("unstamped renderer wrote %s", off.buf)
	}
}

// TestPaceIgnoresBatch: with Pace every request runs on its own timer, so
// more requests than MaxBatch run at once and each gets all its tokens.
func TestPaceIgnoresBatch(t *testing.T) {
	cfg := fast()
	cfg.MaxBatch, cfg.Pace = 1, 20*time.Millisecond
	s, url := startSim(t, cfg)
	const n, tokens = 4, 10
	type out struct {
		chunks int
		done   bool
		err    error
	}
	outs := make(chan out, n)
	for range n {
		resp := post(t, context.Background(), url, "/v1/completions",
			`{"prompt":"x","max_tokens":`+strconv.Itoa(tokens)+`,"stream":true}`)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		go func() {
			defer resp.Body.Close()
			evs, done, err := readEvents(t, resp.Body)
			outs <- out{len(evs), done, err}
		}()
	}
	eventually(t, "all paced requests running at once", func() bool { return s.Stats().Running == n })
	for range n {
		o := <-outs
		if o.err != nil || !o.done || o.chunks != tokens+1 { // tokens + finish
			t.Errorf("stream: %d chunks, done %v, err %v; want %d chunks", o.chunks, o.done, o.err, tokens+1)
		}
	}
	eventually(t, "running back to 0", func() bool { return s.Stats().Running == 0 })
	if st := s.Stats(); st.Completed != n {
		t.Errorf("stats %+v; want %d completed", st, n)
	}
	// Non-streamed, and a client that goes away mid-stream.
	resp := post(t, context.Background(), url, "/v1/completions", `{"prompt":"x","max_tokens":3}`)
	var body responseOut
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.Usage.CompletionTokens != 3 {
		t.Errorf("non-streamed: %+v, %v", body, err)
	}
	resp.Body.Close()
	ctx, cancel := context.WithCancel(context.Background())
	resp = post(t, ctx, url, "/v1/completions", `{"prompt":"x","max_tokens":1000,"stream":true}`)
	eventually(t, "the long stream running", func() bool { return s.Stats().Running == 1 })
	cancel()
	resp.Body.Close()
	eventually(t, "the cancelled pacer gone", func() bool { return s.Stats().Running == 0 })
}
