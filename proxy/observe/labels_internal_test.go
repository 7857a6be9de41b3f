package observe

import (
	"bytes"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/sluice-proxy/sluice/limiter"
)

// sumLine is an exposition's histogram or summary sum line.
var sumLine = regexp.MustCompile(`(?m)^(\S+_sum(?:\{[^}]*\})?) (\S+)$`)

// sumsRounded rounds an exposition's sums to 12 significant digits. A
// latency histogram is sharded by the P the recording goroutine runs on
// (shardHistVec) and its sum is the shards' sums added, so the same
// observations give a sum that differs in the last bits (0.138 and
// 0.13799999999999998) when the goroutine moved to another P between
// them, which a loaded machine's scheduler does.
func sumsRounded(s string) string {
	return sumLine.ReplaceAllStringFunc(s, func(line string) string {
		m := sumLine.FindStringSubmatch(line)
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			return line
		}
		return m[1] + " " + strconv.FormatFloat(v, 'g', 12, 64)
	})
}

// Recording through the combined series cache (byReq), past its cap (each
// series resolved in its own cache), and with no room in it at all gives
// the same exposition: the same series, made only when they got a sample,
// with the same values.
func TestRequestSeriesCache(t *testing.T) {
	records := func() []*Record {
		start := time.Unix(1700000000, 0)
		var rs []*Record
		for i, c := range []struct {
			status               int
			backend, errClass    string
			counted, ttft        bool
			tenant, model, route string
		}{
			{200, "10.0.0.1:8000", "", true, true, "t1", "m1", "chat"},
			{200, "10.0.0.2:8000", "", true, true, "t2", "m1", "chat"},
			{200, "10.0.0.1:8000", "", false, false, "t1", "m2", "chat"},
			{502, "10.0.0.1:8000", "upstream_error", false, false, "t1", "m1", "chat"},
			{429, "", "limit_tokens", false, false, "t3", "m1", "chat"},
			{401, "", "invalid_api_key", false, false, "", "", ""},
			{200, "10.0.0.1:8000", "", true, true, "t1", "m1", "other-route"},
		} {
			r := &Record{ID: "a", Tenant: c.tenant, Method: "POST", Path: "/v1/chat/completions", Proto: "h1",
				Model: c.model, Route: c.route, Backend: c.backend, Status: c.status, Error: c.errClass,
				Start: start, End: start.Add(time.Duration(100+i) * time.Millisecond), Counted: c.counted,
				Usage: limiter.Usage{InputTokens: int64(10 + i), OutputTokens: int64(3 + i)}}
			if c.backend != "" {
				r.Pool = "p"
			}
			if c.ttft {
				r.Stages[TTFT], r.Measured[TTFT] = time.Duration(20+i)*time.Millisecond, true
				r.Stages[Decode], r.Measured[Decode] = 50*time.Millisecond, true
				r.ITL = []uint32{15000, 16000}
			}
			rs = append(rs, r)
		}
		return rs
	}
	expose := func(reqCap int64) (string, int64) {
		reg := prometheus.NewRegistry()
		m := NewMetrics(reg, 10)
		m.reqCap = reqCap
		for range 3 {
			for _, r := range records() {
				m.Record(r)
			}
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		for _, mf := range mfs {
			if err := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain)).Encode(mf); err != nil {
				t.Fatal(err)
			}
		}
		return sumsRounded(b.String()), m.nByReq.Load()
	}
	none, n0 := expose(0)
	some, n3 := expose(3)
	all, n := expose(reqSeriesCap)
	if n0 != 0 || n3 != 3 || n != 7 {
		t.Errorf("kinds kept: %d, %d, %d; want 0, 3, 7", n0, n3, n)
	}
	if some != none || all != none {
		t.Errorf("expositions differ:\n--- no cache:\n%s\n--- cap 3:\n%s\n--- cap %d:\n%s", none, some, reqSeriesCap, all)
	}
	for _, want := range []string{
		`sluice_requests_total{code="200",proto="h1",route="chat",tenant="t1"} 6`,
		`sluice_requests_total{code="401",proto="h1",route="-",tenant="-"} 3`,
		`sluice_tokens_total{direction="in",route="chat",tenant="t1"} 30`,
		`sluice_tokens_total{direction="out",route="chat",tenant="t2"} 12`,
		`sluice_ttft_seconds_count{backend="10.0.0.1:8000",pool="p",proto="h1",route="chat"} 3`,
		`sluice_itl_seconds_count{backend="10.0.0.2:8000",pool="p",proto="h1",route="chat"} 6`,
		`gen_ai_client_token_usage_count{gen_ai_operation_name="chat",gen_ai_provider_name="openai",gen_ai_request_model="m1",gen_ai_token_type="input",server_address="10.0.0.1",server_port="8000"} 6`,
		`gen_ai_server_request_duration_seconds_count{error_type="upstream_error",gen_ai_operation_name="chat",gen_ai_provider_name="openai",gen_ai_request_model="m1",server_address="10.0.0.1",server_port="8000"} 3`,
	} {
		if !bytes.Contains([]byte(all), []byte(want)) {
			t.Errorf("exposition lacks %s", want)
		}
	}
	for _, never := range []string{`direction="in",route="chat",tenant="t3"`, `direction="in",route="chat",tenant="-"`,
		`gen_ai_request_model="m2",gen_ai_token_type`} { // series without a sample
		if bytes.Contains([]byte(all), []byte(never)) {
			t.Errorf("exposition has a series without a sample: %s", never)
		}
	}
}

// BenchmarkLabelsParallel looks up a request's tenant and model label
// values from every core at once, as each finished request does.
//
//	go test -run '^$' -bench BenchmarkLabelsParallel -benchmem ./proxy/observe/
func BenchmarkLabelsParallel(b *testing.B) {
	m := NewMetrics(nil, 100)
	m.tenantLabel("tenant-1")
	m.modelLabel("model-1")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if m.tenantLabel("tenant-1") != "tenant-1" || m.modelLabel("model-1") != "model-1" {
				b.Fatal("label lost")
			}
		}
	})
}
