package loadgen

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseSweep(t *testing.T) {
	s, err := ParseSweep("concurrency=1,2, 4,8")
	if err != nil || s.Kind != SweepConcurrency || len(s.Values) != 4 || s.String() != "concurrency=1,2,4,8" {
		t.Errorf("ParseSweep = %+v, %v", s, err)
	}
	if s, err := ParseSweep("rate=0.5,20"); err != nil || s.Values[0] != 0.5 {
		t.Errorf("rate sweep = %+v, %v", s, err)
	}
	for _, bad := range []string{"", "concurrency", "threads=1,2", "concurrency=1.5", "rate=0", "rate=1,,2", "rate=-1"} {
		if _, err := ParseSweep(bad); err == nil {
			t.Errorf("ParseSweep(%q) succeeded", bad)
		}
	}
}

// curve builds sweep points from (tokens/s, p95 ttft ms) pairs.
func curve(pairs ...[2]float64) []Point {
	var ps []Point
	for i, p := range pairs {
		ps = append(ps, Point{Kind: SweepConcurrency, Value: float64(int(1) << i), OutputTokensPerSec: p[0],
			TTFT: Percentiles{N: 10, P95: time.Duration(p[1] * float64(time.Millisecond))},
			ITL:  Percentiles{N: 100, P95: time.Duration(10+i) * time.Millisecond}})
	}
	return ps
}

func TestFindKnee(t *testing.T) {
	tests := []struct {
		name string
		pts  []Point
		want int
	}{
		{"ttft doubles", curve([2]float64{100, 50}, [2]float64{200, 60}, [2]float64{400, 90}, [2]float64{800, 101}), 3},
		{"throughput flattens", curve([2]float64{100, 50}, [2]float64{200, 55}, [2]float64{210, 60}), 2},
		{"throughput falls", curve([2]float64{100, 50}, [2]float64{190, 55}, [2]float64{150, 70}), 2},
		{"no knee", curve([2]float64{100, 50}, [2]float64{200, 55}, [2]float64{400, 70}), -1},
		{"one point", curve([2]float64{100, 50}), -1},
		{"requests only", []Point{{RequestsPerSec: 10}, {RequestsPerSec: 10.5}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := FindKnee(tt.pts); got != tt.want {
				t.Errorf("FindKnee = %d; want %d", got, tt.want)
			}
		})
	}
}

// svgIDs decodes doc as XML (failing on malformed XML) and returns the id
// attributes found and the root element name.
func svgIDs(t *testing.T, doc []byte) (map[string]bool, string) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(doc))
	ids, root := map[string]bool{}, ""
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return ids, root
		}
		if err != nil {
			t.Fatalf("svg is not well-formed XML: %v\n%s", err, doc)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Local
				if se.Name.Space != "http://www.w3.org/2000/svg" {
					t.Errorf("root namespace %q", se.Name.Space)
				}
			}
			for _, a := range se.Attr {
				if a.Name.Local == "id" {
					ids[a.Value] = true
				}
				if a.Name.Local == "href" {
					t.Errorf("external reference %q", a.Value)
				}
			}
		}
	}
}

func TestWriteSVG(t *testing.T) {
	pts := curve([2]float64{100, 50}, [2]float64{200, 60}, [2]float64{400, 90}, [2]float64{420, 400})
	markKnee(pts)
	if !pts[3].Knee {
		t.Fatalf("knee not marked: %+v", pts)
	}
	var b bytes.Buffer
	if err := WriteSVG(&b, pts); err != nil {
		t.Fatal(err)
	}
	ids, root := svgIDs(t, b.Bytes())
	if root != "svg" {
		t.Errorf("root %q; want svg", root)
	}
	for _, id := range []string{"knee", "ttft", "itl", "axes", "x-ticks", "y-left-ticks", "y-right-ticks", "legend"} {
		if !ids[id] {
			t.Errorf("svg has no element with id %q", id)
		}
	}
	for _, s := range []string{"knee (c=8)", "P95 TTFT (ms)", "P95 ITL (ms)", "output tokens/s", "<polyline"} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("svg lacks %q", s)
		}
	}

	b.Reset()
	if err := WriteSVG(&b, curve([2]float64{100, 50}, [2]float64{200, 55})); err != nil {
		t.Fatal(err)
	}
	if ids, _ := svgIDs(t, b.Bytes()); ids["knee"] || !ids["no-knee"] {
		t.Errorf("without a knee: ids %v", ids)
	}
	b.Reset()
	if err := WriteSVG(&b, nil); err != nil {
		t.Fatal(err)
	}
	svgIDs(t, b.Bytes()) // no points: still well-formed
}

func TestNiceAxis(t *testing.T) {
	for _, tt := range []struct {
		max  float64
		want []float64
	}{
		{9.3, []float64{0, 2, 4, 6, 8, 10}},
		{100, []float64{0, 20, 40, 60, 80, 100}},
		{0.37, []float64{0, 0.1, 0.2, 0.30000000000000004, 0.4}},
		{0, []float64{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1}},
	} {
		a := niceAxis(tt.max)
		ok := len(a.ticks) == len(tt.want) && a.max() >= tt.max
		for i := range a.ticks {
			ok = ok && i < len(tt.want) && math.Abs(a.ticks[i]-tt.want[i]) < 1e-9
		}
		if !ok {
			t.Errorf("niceAxis(%g) = %v; want %v", tt.max, a.ticks, tt.want)
		}
	}
}

func TestSweepRun(t *testing.T) {
	srv := &sseServer{Interval: time.Millisecond}
	cfg := small(startH1(t, srv))
	cfg.Requests = 6
	cfg.Sweep = SweepSpec{Kind: SweepConcurrency, Values: []float64{1, 2, 3}}
	pts, err := Sweep(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(pts) != 3 || srv.requests.Load() != 18 {
		t.Fatalf("%d points, server saw %d; want 3 and 18", len(pts), srv.requests.Load())
	}
	for i, p := range pts {
		if p.Value != float64(i+1) || p.Counts.OK != 6 || p.OutputTokensPerSec <= 0 || p.TTFT.N != 6 {
			t.Errorf("point %d: %+v", i, p)
		}
	}
	var c bytes.Buffer
	if err := WriteSweepCSV(&c, pts); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&c).ReadAll()
	if err != nil || len(rows) != 4 || rows[0][0] != "kind" || rows[1][1] != "1" {
		t.Errorf("sweep csv: %v %v", err, rows)
	}
}

func TestExecuteSweepWritesFiles(t *testing.T) {
	srv := &sseServer{}
	dir := t.TempDir()
	cfg := small(startH1(t, srv))
	cfg.Requests = 4
	cfg.Sweep = SweepSpec{Kind: SweepRate, Values: []float64{50, 100}}
	cfg.SVG, cfg.CSV, cfg.JSON = filepath.Join(dir, "c.svg"), filepath.Join(dir, "c.csv"), filepath.Join(dir, "c.json")
	var out, errOut bytes.Buffer
	if err := Execute(context.Background(), cfg, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "r=50") || errOut.Len() != 0 {
		t.Errorf("stdout %q stderr %q", out.String(), errOut.String())
	}
	svg, err := os.ReadFile(cfg.SVG)
	if err != nil {
		t.Fatal(err)
	}
	svgIDs(t, svg)
	var j struct {
		Points []Point `json:"points"`
	}
	if b, err := os.ReadFile(cfg.JSON); err != nil || json.Unmarshal(b, &j) != nil || len(j.Points) != 2 {
		t.Errorf("sweep json: %v %+v", err, j)
	}
}

func TestExecuteRun(t *testing.T) {
	srv := &sseServer{}
	cfg := small(startH1(t, srv))
	cfg.Requests, cfg.JSON, cfg.Progress = 3, "-", "always"
	var out, errOut syncBuffer
	if err := Execute(context.Background(), cfg, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "sluice bench:") || !strings.Contains(out.String(), `"targets"`) {
		t.Errorf("stdout lacks the table or the json:\n%s", out.String())
	}
	cfg.Target = ""
	if err := Execute(context.Background(), cfg, &out, &errOut); err == nil {
		t.Error("Execute accepted an invalid config")
	}
}

func TestSweepFindsKneeOfSaturatedServer(t *testing.T) {
	// Two slots and 6 tokens 40ms apart: each request holds a slot for
	// at least 240ms, so at concurrency 8 requests queue for several
	// service times (P95 TTFT far above twice the unloaded 40ms). 40ms,
	// not less, so that a scheduling stall on a loaded machine does not
	// double c=2's P95 and put the knee there.
	srv := &slotServer{sse: &sseServer{Interval: 40 * time.Millisecond}, slot: make(chan struct{}, 2)}
	cfg := small(startH1Handler(t, srv))
	cfg.OutputTokens = Dist{Kind: Fixed, A: 6}
	cfg.Requests = 8
	cfg.Sweep = SweepSpec{Kind: SweepConcurrency, Values: []float64{1, 2, 8}}
	pts, err := Sweep(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if k := FindKnee(pts); k != 2 || !pts[2].Knee {
		t.Errorf("knee at %d; want 2 (c=8). points: %+v", k, pts)
	}
	if pts[2].TTFT.P95 < 2*pts[0].TTFT.P95 {
		t.Errorf("p95 ttft at c=8 %v not above twice c=1's %v", pts[2].TTFT.P95, pts[0].TTFT.P95)
	}
	var b bytes.Buffer
	if err := WriteSVG(&b, pts); err != nil {
		t.Fatal(err)
	}
	if ids, _ := svgIDs(t, b.Bytes()); !ids["knee"] {
		t.Error("svg of the sweep has no knee marker")
	}
}
