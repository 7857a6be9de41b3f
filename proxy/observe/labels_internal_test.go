package observe

import "testing"

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
