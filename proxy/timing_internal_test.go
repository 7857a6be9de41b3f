package proxy

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

// appendMillis writes what strconv.AppendFloat writes for the duration in
// milliseconds with three decimals: at the rounding boundaries, around
// ties, at the integer path's limit and for random durations.
func TestAppendMillisMatchesFloat(t *testing.T) {
	ds := []time.Duration{0, 1, 499, 500, 501, 999, 1000, 1499, 1500, 1501, 999_499, 999_500, 999_501, 1_000_000,
		123_456_789, 1<<40 - 1, 1 << 40, 1<<40 + 1, -1, -1500, time.Hour, 1<<63 - 1}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200_000 {
		ds = append(ds, time.Duration(r.Int64N(1<<41)), time.Duration(r.Int64N(10_000_000)), time.Duration(r.Int64N(1000)*1000+500))
	}
	for _, d := range ds {
		want := strconv.AppendFloat(nil, float64(d)/1e6, 'f', 3, 64)
		if got := appendMillis(nil, d); string(got) != string(want) {
			t.Fatalf("appendMillis(%d) = %s; want %s", d, got, want)
		}
	}
}
