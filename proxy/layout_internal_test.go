package proxy

import (
	"testing"
	"time"
	"unsafe"
)

// TestEventFieldsFirst checks that the fields a committed stream's every
// event touches stay in the exchange's first two cache lines and the loop
// stream's first (xline9: each line is a cache miss per token on a loop).
func TestEventFieldsFirst(t *testing.T) {
	var x exchange
	var ls loopStream
	for _, f := range []struct {
		name      string
		off, size uintptr
		limit     uintptr
	}{
		{"exchange.sink", unsafe.Offsetof(x.sink), unsafe.Sizeof(x.sink), 128},
		{"exchange.alias", unsafe.Offsetof(x.alias), unsafe.Sizeof(x.alias), 128},
		{"exchange.trace", unsafe.Offsetof(x.trace), unsafe.Sizeof(x.trace), 128},
		{"exchange.itl", unsafe.Offsetof(x.itl), unsafe.Sizeof(x.itl), 128},
		{"exchange.lastTokenAt", unsafe.Offsetof(x.lastTokenAt), unsafe.Sizeof(x.lastTokenAt), 128},
		{"exchange.lastToken", unsafe.Offsetof(x.lastToken), unsafe.Sizeof(x.lastToken), 128},
		{"exchange.tokens", unsafe.Offsetof(x.tokens), unsafe.Sizeof(x.tokens), 128},
		{"exchange.bytesToUser", unsafe.Offsetof(x.bytesToUser), unsafe.Sizeof(x.bytesToUser), 128},
		{"exchange.dialect", unsafe.Offsetof(x.dialect), unsafe.Sizeof(x.dialect), 128},
		{"exchange.clientGone", unsafe.Offsetof(x.clientGone), unsafe.Sizeof(x.clientGone), 128},
		{"loopStream.x", unsafe.Offsetof(ls.x), unsafe.Sizeof(ls.x), 64},
		{"loopStream.l", unsafe.Offsetof(ls.l), unsafe.Sizeof(ls.l), 64},
		{"loopStream.att", unsafe.Offsetof(ls.att), unsafe.Sizeof(ls.att), 64},
		{"loopStream.sink.out", unsafe.Offsetof(ls.sink) + unsafe.Offsetof(ls.sink.out), unsafe.Sizeof(ls.sink.out), 64},
	} {
		if end := f.off + f.size; end > f.limit {
			t.Errorf("%s ends at byte %d; want ≤ %d", f.name, end, f.limit)
		}
	}
}

// TestITLSamples checks the ITL samples kept in the exchange's slice: one
// per token after the first, past the pooled array's first capacity, and
// none left after releaseITL.
func TestITLSamples(t *testing.T) {
	var x exchange
	t0 := time.Now()
	for i := range 300 {
		x.tokenAt(t0.Add(time.Duration(i) * 2 * time.Millisecond))
	}
	if len(x.itl) != 299 || x.itl[0] != 2000 || x.itl[298] != 2000 {
		t.Fatalf("samples %d (first %v); want 299 of 2000 µs", len(x.itl), x.itl[:min(len(x.itl), 1)])
	}
	if p50, _, _, n := x.itlPercentiles(); n != 299 || p50 != 2*time.Millisecond {
		t.Errorf("itlPercentiles: P50 %v of %d; want 2ms of 299", p50, n)
	}
	x.releaseITL()
	if x.itl != nil || x.itlBuf != nil {
		t.Errorf("after releaseITL: itl %d samples, itlBuf %v; want none", len(x.itl), x.itlBuf)
	}
}
