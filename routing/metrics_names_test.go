package routing

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The KV-cache gauge holds a fraction, so its name ends in _ratio; the old
// name carries the same value for one release.
func TestKVCacheGaugeRatioName(t *testing.T) {
	p, err := NewPool(PoolConfig{Name: "p", Backends: []BackendConfig{{URL: "http://127.0.0.1:1"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Backends()[0].observeLoadHeader("TEXT named_metrics.num_requests_waiting=1, named_metrics.kv_cache_usage_perc=0.25", time.Now())
	reg := prometheus.NewRegistry()
	if err := RegisterMetrics(reg, func() []*Pool { return []*Pool{p} }); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"sluice_backend_engine_kv_cache_usage_ratio", "sluice_backend_engine_kv_cache_usage"} {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, mf := range mfs {
			if mf.GetName() == name {
				found = true
				if v := mf.GetMetric()[0].GetGauge().GetValue(); v != 0.25 {
					t.Errorf("%s = %v; want 0.25", name, v)
				}
			}
		}
		if !found {
			t.Errorf("%s not exported", name)
		}
	}
}
