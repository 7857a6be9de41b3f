package evloop

// TEMPORARY probe (branch tokentail, not for merging): SLUICE_TOKPROBE=N
// prints, every N relayed tokens, where a token's time goes on the loop.

import (
	"bytes"
	"fmt"
	"os"
	"runtime/metrics"
	"slices"
	"strconv"
	"time"
)

var probeEvery, _ = strconv.Atoi(os.Getenv("SLUICE_TOKPROBE"))

type tokSample struct {
	wake, inBatch, total int64 // ns: emit→batch start, batch start→write, emit→write
	pos, n               int   // the stream's place among the batch's upstream reads, the batch's size
	help                 bool
}

type tokProbe struct {
	pos     int
	batchN  int
	help    bool
	samples []tokSample
	scratch []byte
}

var emitKey = []byte(`"sluice_emit_ns":`)

// lastEmit is the first emit stamp in p (0 if none).
func lastEmit(p []byte) int64 {
	i := bytes.Index(p, emitKey)
	if i < 0 {
		return 0
	}
	q := bytes.TrimLeft(p[i+len(emitKey):], " ")
	j := 0
	for j < len(q) && q[j] >= '0' && q[j] <= '9' {
		j++
	}
	v, _ := strconv.ParseInt(string(q[:j]), 10, 64)
	return v
}

func (l *loop) probeRead(p []byte, batch time.Time) {
	if probeEvery <= 0 {
		return
	}
	e := lastEmit(p)
	if e == 0 {
		return
	}
	now := time.Now().UnixNano()
	b := batch.UnixNano()
	l.probe.samples = append(l.probe.samples, tokSample{wake: b - e, inBatch: now - b, total: now - e, pos: l.probe.pos, n: l.probe.batchN, help: l.probe.help})
	l.probe.pos++
	if len(l.probe.samples) >= probeEvery {
		l.probe.print()
	}
}

func q(v []int64, f float64) float64 {
	if len(v) == 0 {
		return 0
	}
	return float64(v[min(len(v)-1, int(f*float64(len(v))))]) / 1e3
}

func (p *tokProbe) print() {
	s := p.samples
	var wake, in, tot []int64
	for _, x := range s {
		wake, in, tot = append(wake, x.wake), append(in, x.inBatch), append(tot, x.total)
	}
	slices.Sort(wake)
	slices.Sort(in)
	slices.Sort(tot)
	line := fmt.Sprintf("tokprobe n=%d emit→write P50/P90/P99 %.0f/%.0f/%.0f µs; emit→batch %.0f/%.0f/%.0f; batch→write %.0f/%.0f/%.0f;",
		len(s), q(tot, .5), q(tot, .9), q(tot, .99), q(wake, .5), q(wake, .9), q(wake, .99), q(in, .5), q(in, .9), q(in, .99))
	// batch sizes (upstream reads per batch, per token) and the P99 by position
	var sizes []int64
	for _, x := range s {
		sizes = append(sizes, int64(x.n))
	}
	slices.Sort(sizes)
	line += fmt.Sprintf(" reads/batch per token P50/P90/P99 %d/%d/%d;", sizes[len(sizes)/2], sizes[len(sizes)*9/10], sizes[len(sizes)*99/100])
	// which tokens are in the top 1% of emit→write: share whose batch→write > emit→batch
	cut := tot[len(tot)*99/100]
	var nTail, inDom, viaHelp, helpAll int
	for _, x := range s {
		if x.help {
			helpAll++
		}
	}
	var tailPos, tailN []int64
	for _, x := range s {
		if x.total >= cut {
			nTail++
			if x.inBatch > x.wake {
				inDom++
			}
			if x.help {
				viaHelp++
			}
			tailPos = append(tailPos, int64(x.pos))
			tailN = append(tailN, int64(x.n))
		}
	}
	slices.Sort(tailPos)
	slices.Sort(tailN)
	line += fmt.Sprintf(" top1%%: %d, batch→write dominant in %d, via Help %d (all: %d), pos P50 %d, batch size P50 %d", nTail, inDom, viaHelp, helpAll, tailPos[len(tailPos)/2], tailN[len(tailN)/2])
	for _, b := range [][2]int{{0, 1}, {1, 4}, {4, 8}, {8, 16}, {16, 32}, {32, 1 << 30}} {
		var v []int64
		for _, x := range s {
			if x.pos >= b[0] && x.pos < b[1] {
				v = append(v, x.total)
			}
		}
		slices.Sort(v)
		line += fmt.Sprintf(" | pos %d-%d: %d tok, P50/P99 %.0f/%.0f", b[0], b[1]-1, len(v), q(v, .5), q(v, .99))
	}
	line += schedLine()
	fmt.Fprintln(os.Stderr, line)
	p.samples = p.samples[:0]
}

var lastSched []uint64
var lastGC uint64

// schedLine is the scheduler's latency (runnable → running) since the
// last call, P50/P90/P99 µs, and the GC cycles since then.
func schedLine() string {
	ms := []metrics.Sample{{Name: "/sched/latencies:seconds"}, {Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(ms)
	h := ms[0].Value.Float64Histogram()
	gc := ms[1].Value.Uint64()
	cur := append([]uint64(nil), h.Counts...)
	d := make([]uint64, len(cur))
	var tot uint64
	for i := range cur {
		if i < len(lastSched) {
			d[i] = cur[i] - lastSched[i]
		} else {
			d[i] = cur[i]
		}
		tot += d[i]
	}
	lastSched = cur
	ngc := gc - lastGC
	lastGC = gc
	at := func(f float64) float64 {
		var c uint64
		for i, v := range d {
			c += v
			if float64(c) >= f*float64(tot) {
				return h.Buckets[i+1] * 1e6
			}
		}
		return 0
	}
	return fmt.Sprintf(" || sched P50/P90/P99/P99.9 %.0f/%.0f/%.0f/%.0f µs over %d; gc %d", at(.5), at(.9), at(.99), at(.999), tot, ngc)
}
