package proxy

import (
	"testing"
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
		{"exchange.usage", unsafe.Offsetof(x.usage), unsafe.Sizeof(x.usage), 128},
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
