package loadgen

import (
	"reflect"
	"testing"
)

func TestParseServerTiming(t *testing.T) {
	tests := []struct {
		name   string
		values []string
		want   []Metric
	}{
		{"simple", []string{"queue;dur=12.3"}, []Metric{{Name: "queue", Dur: 12.3, HasDur: true}}},
		{"several with spaces", []string{"net-rtt;dur=0.4 , tls; dur = 2,auth;dur=0.01"}, []Metric{
			{Name: "net-rtt", Dur: 0.4, HasDur: true}, {Name: "tls", Dur: 2, HasDur: true},
			{Name: "auth", Dur: 0.01, HasDur: true}}},
		{"quoted desc with comma and semicolon", []string{`prefill;dur=3;desc="12 tokens, batch; 4", edge;dur=1`}, []Metric{
			{Name: "prefill", Dur: 3, HasDur: true, Desc: "12 tokens, batch; 4"}, {Name: "edge", Dur: 1, HasDur: true}}},
		{"escapes in quoted string", []string{`x;desc="a \"b\" c\\d";dur=1`}, []Metric{
			{Name: "x", Dur: 1, HasDur: true, Desc: `a "b" c\d`}}},
		{"quoted dur", []string{`x;dur="4.5"`}, []Metric{{Name: "x", Dur: 4.5, HasDur: true}}},
		{"missing dur", []string{"cache;desc=hit, route"}, []Metric{{Name: "cache", Desc: "hit"}, {Name: "route"}}},
		{"param without value", []string{"miss;flag;dur=2"}, []Metric{{Name: "miss", Dur: 2, HasDur: true}}},
		{"first dur wins", []string{"x;dur=1;dur=2"}, []Metric{{Name: "x", Dur: 1, HasDur: true}}},
		{"case-insensitive param names", []string{"x;DUR=7;Desc=y"}, []Metric{{Name: "x", Dur: 7, HasDur: true, Desc: "y"}}},
		{"non-numeric dur", []string{"x;dur=fast, y;dur=NaN, z;dur=1e3"}, []Metric{
			{Name: "x"}, {Name: "y"}, {Name: "z", Dur: 1000, HasDur: true}}},
		{"multiple header values", []string{"a;dur=1", "b;dur=2, c;dur=3"}, []Metric{
			{Name: "a", Dur: 1, HasDur: true}, {Name: "b", Dur: 2, HasDur: true}, {Name: "c", Dur: 3, HasDur: true}}},
		{"garbage ignored", []string{`a;dur=1, @@@ ;; junk, "quoted, garbage", b c;dur=9, d;dur=2`}, []Metric{
			{Name: "a", Dur: 1, HasDur: true}, {Name: "d", Dur: 2, HasDur: true}}},
		{"unterminated quote drops the entry", []string{`a;dur=1, b;desc="open, c;dur=3`}, []Metric{
			{Name: "a", Dur: 1, HasDur: true}}},
		{"empty and commas only", []string{"", " , ,, "}, nil},
		{"trailer metrics", []string{"decode;dur=2000.5, itl-p50;dur=10.1, itl-p99;dur=14, tokens;dur=200, tps;dur=99.9"}, []Metric{
			{Name: "decode", Dur: 2000.5, HasDur: true}, {Name: "itl-p50", Dur: 10.1, HasDur: true},
			{Name: "itl-p99", Dur: 14, HasDur: true}, {Name: "tokens", Dur: 200, HasDur: true},
			{Name: "tps", Dur: 99.9, HasDur: true}}},
		{"counts in desc", []string{`decode;dur=2000.5, tokens;desc="200", tps;desc="99.9"`}, []Metric{
			{Name: "decode", Dur: 2000.5, HasDur: true}, {Name: "tokens", Desc: "200"}, {Name: "tps", Desc: "99.9"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ParseServerTiming(nil, tt.values...)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseServerTiming(%q)\n got %+v\nwant %+v", tt.values, got, tt.want)
			}
		})
	}
}

// Value reads Sluice's counts from desc (and from dur, as older versions
// sent them); a desc that is not a number has no value.
func TestMetricValue(t *testing.T) {
	ms := ParseServerTiming(nil, `tokens;desc="12", tps;desc="44.2", old;dur=3, label;desc="512 tokens", none`)
	want := []struct {
		v  float64
		ok bool
	}{{12, true}, {44.2, true}, {3, true}, {0, false}, {0, false}}
	for i, m := range ms {
		if v, ok := m.Value(); v != want[i].v || ok != want[i].ok {
			t.Errorf("%s.Value() = %v, %v; want %v, %v", m.Name, v, ok, want[i].v, want[i].ok)
		}
	}
}

func TestLookup(t *testing.T) {
	ms := ParseServerTiming(nil, "ttft;desc=x, ttft;dur=4, ttft;dur=5")
	if d, ok := Lookup(ms, "ttft"); !ok || d != 4 {
		t.Errorf("Lookup = %v, %v; want 4, true (first with a dur)", d, ok)
	}
	if _, ok := Lookup(ms, "queue"); ok {
		t.Error("Lookup found a metric that is not there")
	}
}

func FuzzParseServerTiming(f *testing.F) {
	for _, s := range []string{"a;dur=1", `x;desc="a\"b";dur=2, y`, `;;,,"`, `a;desc="\`, "a;dur=1e400"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, m := range ParseServerTiming(nil, s) {
			if m.Name == "" {
				t.Fatalf("empty metric name from %q", s)
			}
		}
	})
}
