package observe_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/sluice-proxy/sluice/limiter"
	"github.com/sluice-proxy/sluice/proxy/observe"
)

// streamRecord is a finished chat stream served by the backend at
// 127.0.0.1:8000: ttft 120 ms, 11 gaps of 20 ms (decode 220 ms), 12 output
// tokens and 30 input tokens.
func streamRecord() *observe.Record {
	start := time.Unix(1700000000, 0)
	r := &observe.Record{ID: "a", Tenant: "t1", Method: "POST", Path: "/v1/chat/completions", Proto: "h2",
		Model: "sim-small", Route: "chat", Pool: "p", Backend: "127.0.0.1:8000", Status: 200,
		Start: start, End: start.Add(350 * time.Millisecond),
		Usage: limiter.Usage{InputTokens: 30, OutputTokens: 12}, Counted: true}
	for i := range observe.Timed {
		r.Stages[i], r.Measured[i] = time.Millisecond, true
	}
	r.Stages[observe.TTFT] = 120 * time.Millisecond
	r.Stages[observe.Decode] = 220 * time.Millisecond
	for range 11 {
		r.ITL = append(r.ITL, 20000)
	}
	return r
}

// gather returns the registry's families by name.
func gather(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// series returns the family's series whose labels include want.
func series(t *testing.T, mf *dto.MetricFamily, want map[string]string) *dto.Metric {
	t.Helper()
	if mf == nil {
		t.Fatalf("family missing; want a series %v", want)
	}
	for _, m := range mf.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		ok := true
		for k, v := range want {
			if have[k] != v {
				ok = false
			}
		}
		if ok {
			return m
		}
	}
	t.Fatalf("%s has no series with %v; has %v", mf.GetName(), want, mf.GetMetric())
	return nil
}

// The OpenTelemetry GenAI server metrics are exported under the names the
// OTel→Prometheus compatibility rules give them (dots to underscores, unit
// "s" as _seconds, an annotation unit such as {token} dropped), with the
// semantic conventions' attributes as labels, the recommended classic
// buckets, and values that follow from the request.
func TestGenAIMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := observe.NewMetrics(reg, 0)
	m.Record(streamRecord())
	failed := streamRecord()
	failed.Status, failed.Error, failed.Path, failed.Counted = 504, "upstream_timeout", "/v1/messages", false
	m.Record(failed)
	refused := streamRecord() // no backend: not a model server's request
	refused.Backend, refused.Status, refused.Model = "", 429, "random-client-string"
	m.Record(refused)

	fams := gather(t, reg)
	chat := map[string]string{"gen_ai_operation_name": "chat", "gen_ai_provider_name": "openai",
		"gen_ai_request_model": "sim-small", "server_address": "127.0.0.1", "server_port": "8000"}
	ttft := series(t, fams["gen_ai_server_time_to_first_token_seconds"], chat).GetHistogram()
	if ttft.GetSampleCount() != 1 || ttft.GetSampleSum() != 0.12 {
		t.Errorf("TTFT count %d sum %v; want 1 sample of 0.12 s", ttft.GetSampleCount(), ttft.GetSampleSum())
	}
	if got := len(ttft.GetBucket()); got != 16 || ttft.GetBucket()[0].GetUpperBound() != 0.001 {
		t.Errorf("TTFT has %d classic buckets from %v; want OTel's 16 from 0.001", got, ttft.GetBucket()[0].GetUpperBound())
	}
	// 220 ms of decode over the 11 tokens after the first.
	tpot := series(t, fams["gen_ai_server_time_per_output_token_seconds"], chat).GetHistogram()
	if tpot.GetSampleCount() != 1 || tpot.GetSampleSum() < 0.01999 || tpot.GetSampleSum() > 0.02001 {
		t.Errorf("time per output token count %d sum %v; want one sample of 0.02 s", tpot.GetSampleCount(), tpot.GetSampleSum())
	}
	okDur := series(t, fams["gen_ai_server_request_duration_seconds"], chat)
	for _, l := range okDur.GetLabel() {
		if l.GetName() == "error_type" && l.GetValue() != "" {
			t.Errorf("a successful request's duration has error_type %q; want none (empty)", l.GetValue())
		}
	}
	if h := okDur.GetHistogram(); h.GetSampleCount() != 1 || h.GetSampleSum() != 0.35 {
		t.Errorf("duration count %d sum %v; want one sample of 0.35 s", h.GetSampleCount(), h.GetSampleSum())
	}
	bad := series(t, fams["gen_ai_server_request_duration_seconds"], map[string]string{
		"error_type": "upstream_timeout", "gen_ai_provider_name": "anthropic", "gen_ai_operation_name": "chat"})
	if bad.GetHistogram().GetSampleCount() != 1 {
		t.Errorf("failed request's duration count %d; want 1", bad.GetHistogram().GetSampleCount())
	}
	if n := len(fams["gen_ai_server_time_to_first_token_seconds"].GetMetric()); n != 1 {
		t.Errorf("%d TTFT series; want 1 (a failed request has no TTFT sample)", n)
	}
	for typ, want := range map[string]float64{"input": 30, "output": 12} {
		l := map[string]string{"gen_ai_token_type": typ}
		for k, v := range chat {
			l[k] = v
		}
		h := series(t, fams["gen_ai_client_token_usage"], l).GetHistogram()
		if h.GetSampleCount() != 1 || h.GetSampleSum() != want {
			t.Errorf("token usage %s: count %d sum %v; want one sample of %v", typ, h.GetSampleCount(), h.GetSampleSum(), want)
		}
	}
	for _, mf := range fams {
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetValue() == "random-client-string" {
					t.Errorf("%s labels a request that reached no backend with its client-chosen model", mf.GetName())
				}
			}
		}
	}
}

// A client's model string cannot grow the GenAI series without bound:
// past 100 models, the rest share "other".
func TestGenAIModelLabelBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := observe.NewMetrics(reg, 0)
	for i := range 150 {
		r := streamRecord()
		r.Model = "m" + strings.Repeat("x", i)
		m.Record(r)
	}
	models := map[string]bool{}
	for _, s := range gather(t, reg)["gen_ai_server_time_to_first_token_seconds"].GetMetric() {
		for _, l := range s.GetLabel() {
			if l.GetName() == "gen_ai_request_model" {
				models[l.GetValue()] = true
			}
		}
	}
	if len(models) != 101 || !models["other"] {
		t.Fatalf("%d model label values; want 100 and other", len(models))
	}
}

// scrape fetches the registry's /metrics over a loopback listener, asking
// for format accept, and decodes what comes back.
func scrape(t *testing.T, reg *prometheus.Registry, accept string) (map[string]*dto.MetricFamily, string) {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	req.Header.Set("Accept", accept)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	format := expfmt.ResponseFormat(resp.Header)
	out := map[string]*dto.MetricFamily{}
	dec := expfmt.NewDecoder(bytes.NewReader(raw), format)
	for {
		mf := &dto.MetricFamily{}
		if err := dec.Decode(mf); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding %s: %v", format, err)
		}
		out[mf.GetName()] = mf
	}
	return out, string(raw)
}

// TTFT, ITL, stage and GenAI latency histograms are native histograms
// (schema and spans in the protobuf exposition, buckets at most 10% wide)
// and keep their classic buckets, which the text format still shows.
func TestNativeHistogramsScraped(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := observe.NewMetrics(reg, 0)
	m.Record(streamRecord())
	proto, _ := scrape(t, reg, `application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited`)
	for _, name := range []string{"sluice_ttft_seconds", "sluice_itl_seconds", "sluice_stage_seconds",
		"gen_ai_server_time_to_first_token_seconds", "gen_ai_server_time_per_output_token_seconds",
		"gen_ai_server_request_duration_seconds"} {
		mf := proto[name]
		if mf == nil {
			t.Errorf("%s missing from the protobuf scrape", name)
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		// Schema 3 has buckets 2^(2^-3) ≈ 1.09 wide, the coarsest within the
		// factor 1.1.
		if h.Schema == nil || h.GetSchema() < 3 || len(h.GetPositiveSpan()) == 0 || len(h.GetPositiveDelta()) == 0 {
			t.Errorf("%s: schema %v, %d spans, %d deltas; want a native histogram of schema ≥ 3",
				name, h.Schema, len(h.GetPositiveSpan()), len(h.GetPositiveDelta()))
		}
		if len(h.GetBucket()) == 0 {
			t.Errorf("%s: no classic buckets beside the native ones", name)
		}
	}
	if h := proto["gen_ai_client_token_usage"].GetMetric()[0].GetHistogram(); h.Schema != nil {
		t.Errorf("token usage is a native histogram (schema %d); want classic buckets only", h.GetSchema())
	}
	text, raw := scrape(t, reg, "text/plain;version=0.0.4")
	for _, line := range []string{`sluice_ttft_seconds_bucket{`, `gen_ai_server_time_to_first_token_seconds_bucket{`,
		`le="0.001"`, `sluice_itl_seconds_bucket{`} {
		if !strings.Contains(raw, line) {
			t.Errorf("text exposition lacks %s", line)
		}
	}
	if text["sluice_ttft_seconds"] == nil {
		t.Error("text exposition does not parse to sluice_ttft_seconds")
	}
}

// BenchmarkRecordStream measures the metrics of one finished stream of
// 1000 tokens (999 ITL samples): an op is one request, so ns/op ÷ 1000 is
// the per-token cost, paid once the request has ended (the relay itself
// does no metric work per event).
//
//	go test -run '^$' -bench BenchmarkRecordStream -benchmem ./proxy/observe/
func BenchmarkRecordStream(b *testing.B) {
	m := observe.NewMetrics(prometheus.NewRegistry(), 10)
	r := streamRecord()
	r.ITL = r.ITL[:0]
	for i := range 999 {
		r.ITL = append(r.ITL, uint32(15000+i*37%20000))
	}
	r.Usage.OutputTokens = 1000
	m.Record(r) // the series exist after the first request
	b.ReportAllocs()
	for b.Loop() {
		m.Record(r)
	}
}

// BenchmarkRecordSmall measures the metrics of one finished non-streamed
// request (no ITL samples): the series lookups and the observations.
//
//	go test -run '^$' -bench BenchmarkRecordSmall -benchmem ./proxy/observe/
func BenchmarkRecordSmall(b *testing.B) {
	m := observe.NewMetrics(prometheus.NewRegistry(), 10)
	r := streamRecord()
	r.ITL = nil
	m.Record(r) // the series exist after the first request
	b.ReportAllocs()
	for b.Loop() {
		m.Record(r)
	}
}

// BenchmarkRecordSmallParallel is BenchmarkRecordSmall from GOMAXPROCS
// goroutines at once, all into the same series (one route, backend and
// model, as target 3's load): the cross-core cost of the observations.
//
//	go test -run '^$' -bench BenchmarkRecordSmallParallel -cpu 1,2 -benchmem ./proxy/observe/
func BenchmarkRecordSmallParallel(b *testing.B) {
	m := observe.NewMetrics(prometheus.NewRegistry(), 10)
	r := streamRecord()
	r.ITL = nil
	m.Record(r)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Record(r)
		}
	})
}

// Tenant labels handed out from many goroutines at once stay bounded: with
// room for 10, exactly 10 tenants get their own value and every other one
// shares "other", and a tenant that got its own value keeps it. Run with
// -race: lookups take no lock.
func TestTenantLabelBoundedConcurrent(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := observe.NewMetrics(reg, 10)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				r := streamRecord()
				r.Tenant = fmt.Sprintf("t%d", (i+g*7)%40)
				m.Record(r)
			}
		})
	}
	wg.Wait()
	counts := map[string]float64{}
	for _, s := range gather(t, reg)["sluice_requests_total"].GetMetric() {
		for _, l := range s.GetLabel() {
			if l.GetName() == "tenant" {
				counts[l.GetValue()] += s.GetCounter().GetValue()
			}
		}
	}
	if len(counts) != 11 || counts["other"] == 0 {
		t.Fatalf("tenant label values %v; want 10 tenants and other", counts)
	}
	total := 0.0
	for _, c := range counts {
		total += c
	}
	if total != 8*200 {
		t.Fatalf("%v requests counted, want %d", total, 8*200)
	}
	for tenant := range counts {
		if tenant == "other" {
			continue
		}
		r := streamRecord()
		r.Tenant = tenant
		m.Record(r) // a tenant given its own value keeps it
	}
	after := 0
	for _, s := range gather(t, reg)["sluice_requests_total"].GetMetric() {
		for _, l := range s.GetLabel() {
			if l.GetName() == "tenant" && l.GetValue() != "other" {
				after++
			}
		}
	}
	if after != 10 {
		t.Fatalf("%d own tenant series after re-recording, want 10", after)
	}
}
