package proxy_test

import (
	"bufio"
	"bytes"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// epoch is the shared clock of the stamping backend and the reader (both
// in this process, so the monotonic clock is common).
var epoch = time.Now()

// stampBackend streams the number of events the "n" query asks for, every
// "every" (a duration; empty: as fast as the connection takes them), each
// carrying the time it was written.
type stampBackend struct{}

func (stampBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.Atoi(r.URL.Query().Get("n"))
	every, _ := time.ParseDuration(r.URL.Query().Get("every"))
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	var tick <-chan time.Time
	if every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}
	buf := make([]byte, 0, 128)
	for i := 0; i < n; i++ {
		if tick != nil {
			<-tick
		}
		buf = append(buf[:0], `data: {"choices":[{"delta":{"content":"t"}}],"ns":`...)
		buf = strconv.AppendInt(buf, int64(time.Since(epoch)), 10)
		buf = append(buf, "}\n\n"...)
		if _, err := w.Write(buf); err != nil {
			return
		}
		rc.Flush()
	}
	w.Write([]byte("data: [DONE]\n\n"))
}

// protoCase is one way for a client to reach the backend.
type protoCase struct {
	name, url string
	client    *http.Client
}

// h1Pool is an HTTP/1.1 client that keeps enough idle connections for
// concurrent streams (one connection each).
func h1Pool() *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: insecure(), MaxIdleConnsPerHost: 64}}
}

// protoCases are the direct connection (HTTP/1.1 to the backend) and
// Sluice over each client-facing protocol; the hop from Sluice to the
// backend is HTTP/1.1 in every case, so differences are the edge's.
func protoCases(b *testing.B, backendURL string) []protoCase {
	e := startEdge(b, edgeOpts{pool: poolOf(backendURL)})
	return []protoCase{
		{"direct", backendURL, h1Pool()},
		{"h1", e.https, h1Pool()},
		{"h2", e.https, h2Client()},
		{"h3", e.h3, h3Client(b)},
	}
}

// stream asks for n events and appends to delays (unless nil), for each,
// the delay from the backend writing it to the client reading it.
func (c protoCase) stream(b *testing.B, n int, every time.Duration, delays []time.Duration) []time.Duration {
	url := c.url + "/v1/chat/completions?n=" + strconv.Itoa(n) + "&every=" + every.String()
	resp := post(b, c.client, url, chatBody(""))
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("%s: status %d", c.name, resp.StatusCode)
	}
	br := bufio.NewReaderSize(resp.Body, 32<<10)
	got := 0
	for {
		line, err := br.ReadSlice('\n')
		if i := bytes.Index(line, []byte(`"ns":`)); i >= 0 {
			now := time.Since(epoch)
			ns, _ := strconv.ParseInt(string(bytes.TrimRight(line[i+5:], "}\n")), 10, 64)
			if delays != nil {
				delays = append(delays, now-time.Duration(ns))
			}
			got++
		}
		if err != nil {
			break
		}
	}
	if got != n {
		b.Fatalf("%s: got %d events; want %d", c.name, got, n)
	}
	return delays
}

// benchCase is c as one of the cases benchStreams runs.
func (c protoCase) benchCase() benchCase { return benchCase{c.name, c.stream} }

// streams runs k streams of n events at once and waits for them all.
func (c benchCase) streams(b *testing.B, k, n int, every time.Duration) {
	var wg sync.WaitGroup
	for range k {
		wg.Go(func() { c.stream(b, n, every, nil) })
	}
	wg.Wait()
}

// cpuTime is the process's user plus system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkProtocols compares Sluice over HTTP/1.1 (TLS), HTTP/2 (TLS) and
// HTTP/3 with a direct connection to the backend, in one run.
//
// delay: an op is a round of 500 events paced at 1 ms, streamed through
// each case in turn; it reports the P50 and P99 delay from the backend
// writing an event to the client reading it, per case, and Sluice's P50 and
// P99 as a ratio to direct ("h3-p50-x").
//
// cpu: an op is a round of 20 concurrent streams of 250 events paced at
// 2 ms (5,000 events), through each case in turn; it reports the
// process's CPU time (user + system: backend, Sluice and client, all in
// this process) per 1,000 events, per case, and as a ratio to direct
// ("h3-cpu-x"). Each client's own cost for its protocol is included.
// Paced streams make every event its own write and read, as tokens are;
// a flood would let the proxy batch events and look cheaper than direct.
//
//	go test -run '^$' -bench BenchmarkProtocols -benchtime 4x -count 5 ./proxy/
func BenchmarkProtocols(b *testing.B) {
	srv := httptest.NewServer(stampBackend{})
	defer srv.Close()
	benchStreams(b, func(b *testing.B) []benchCase {
		var cases []benchCase
		for _, c := range protoCases(b, srv.URL) {
			cases = append(cases, c.benchCase())
		}
		return cases
	})
}

// benchStreams runs the "delay" and "cpu" sub-benchmarks shared by
// BenchmarkProtocols and BenchmarkWSBridge over the cases that newCases
// builds; the first case is the baseline of the ratios.
//
// delay: 500 events 1 ms apart per op and case, in turn; reports per-event
// delay P50 and P99 per case and as ratios. cpu: 20 concurrent streams of
// 250 events 2 ms apart per op and case; reports the process's CPU time per
// 1,000 events per case and as a ratio.
func benchStreams(b *testing.B, newCases func(b *testing.B) []benchCase) {
	b.Run("delay", func(b *testing.B) {
		cases := newCases(b)
		const n = 500
		all := make([][]time.Duration, len(cases))
		for i, c := range cases {
			all[i] = make([]time.Duration, 0, b.N*n)
			c.stream(b, 10, 0, nil) // connect and warm up
		}
		b.ResetTimer()
		for range b.N {
			for i, c := range cases {
				all[i] = c.stream(b, n, time.Millisecond, all[i])
			}
		}
		b.StopTimer()
		var p50, p99 []time.Duration
		for i, c := range cases {
			slices.Sort(all[i])
			p50 = append(p50, all[i][len(all[i])/2])
			p99 = append(p99, all[i][len(all[i])*99/100])
			b.ReportMetric(float64(p50[i].Microseconds()), c.name+"-p50-µs")
			b.ReportMetric(float64(p99[i].Microseconds()), c.name+"-p99-µs")
			if i > 0 {
				b.ReportMetric(float64(p50[i])/float64(p50[0]), c.name+"-p50-x")
				b.ReportMetric(float64(p99[i])/float64(p99[0]), c.name+"-p99-x")
			}
		}
		b.ReportMetric(0, "ns/op")
	})
	b.Run("cpu", func(b *testing.B) {
		cases := newCases(b)
		const streams, n = 20, 250
		for _, c := range cases {
			c.streams(b, streams, 10, 0) // open the connections and warm up
		}
		cpu := make([]time.Duration, len(cases))
		b.ResetTimer()
		for range b.N {
			for i, c := range cases {
				start := cpuTime(b)
				c.streams(b, streams, n, 2*time.Millisecond)
				cpu[i] += cpuTime(b) - start
			}
		}
		b.StopTimer()
		events := float64(b.N * streams * n)
		for i, c := range cases {
			b.ReportMetric(float64(cpu[i].Microseconds())/events*1000, c.name+"-cpu-µs/1k")
			if i > 0 {
				b.ReportMetric(float64(cpu[i])/float64(cpu[0]), c.name+"-cpu-x")
			}
		}
		b.ReportMetric(0, "ns/op")
	})
}
