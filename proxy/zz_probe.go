package proxy

// TEMPORARY instrumentation (branch first5, not to be merged).

import (
	"bytes"
	"fmt"
	"os"
	"runtime/metrics"
	"slices"
	"strconv"
	"sync"
	"time"
)

var probeOn = os.Getenv("SLUICE_FIRSTPROBE") != ""

type probeSample struct{ d [9]time.Duration }

var probeNames = [9]string{"start→RT", "RT→head", "head→first", "emit→first", "first→wrote", "start→wrote", "sent→start", "sent→entry", "entry→start"}

var probe struct {
	mu   sync.Mutex
	s    []probeSample
	last []metrics.Sample
}

func emitNs(ev []byte) int64 {
	i := bytes.Index(ev, []byte(`"sluice_emit_ns":`))
	if i < 0 {
		return 0
	}
	j := i + len(`"sluice_emit_ns":`)
	for j < len(ev) && ev[j] == ' ' {
		j++
	}
	k := j
	for k < len(ev) && ev[k] >= '0' && ev[k] <= '9' {
		k++
	}
	n, _ := strconv.ParseInt(string(ev[j:k]), 10, 64)
	return n
}

func probeRecord(x *exchange, l *leg, rt time.Time, emit int64, wrote time.Time) {
	if !probeOn {
		return
	}
	var s probeSample
	s.d[0] = rt.Sub(x.start)
	s.d[1] = l.headers.Sub(rt)
	s.d[2] = l.first.Sub(l.headers)
	if emit > 0 {
		s.d[3] = time.Duration(l.first.UnixNano() - emit)
	}
	s.d[4] = wrote.Sub(l.first)
	s.d[5] = wrote.Sub(x.start)
	if v, _ := strconv.ParseInt(x.r.Header.Get("X-Probe-Sent"), 10, 64); v > 0 {
		s.d[6] = time.Duration(x.start.UnixNano() - v)
		if e, _ := strconv.ParseInt(x.r.Header.Get("X-Probe-Entry"), 10, 64); e > 0 {
			s.d[7] = time.Duration(e - v)
			s.d[8] = time.Duration(x.start.UnixNano() - e)
		}
	}
	probe.mu.Lock()
	probe.s = append(probe.s, s)
	var out []probeSample
	if len(probe.s) >= probeEvery {
		out, probe.s = probe.s, nil
	}
	probe.mu.Unlock()
	if out != nil {
		go probeDump(out)
	}
}

func probeDump(s []probeSample) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "FIRSTPROBE n=%d", len(s))
	for i := range probeNames {
		v := make([]time.Duration, len(s))
		for j := range s {
			v[j] = s[j].d[i]
		}
		slices.Sort(v)
		p := func(q float64) float64 { return float64(v[int(q*float64(len(v)-1))].Microseconds()) }
		fmt.Fprintf(&b, " | %s P50 %.0f P90 %.0f P99 %.0f", probeNames[i], p(.5), p(.9), p(.99))
	}
	cur := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(cur)
	h := cur[0].Value.Float64Histogram()
	probe.mu.Lock()
	prev := probe.last
	probe.last = []metrics.Sample{{Name: "/sched/latencies:seconds", Value: cur[0].Value}}
	probe.mu.Unlock()
	counts := slices.Clone(h.Counts)
	if prev != nil {
		ph := prev[0].Value.Float64Histogram()
		for i := range counts {
			counts[i] -= ph.Counts[i]
		}
	}
	var tot uint64
	for _, c := range counts {
		tot += c
	}
	q := func(f float64) float64 {
		var acc uint64
		for i, c := range counts {
			acc += c
			if float64(acc) >= f*float64(tot) {
				return h.Buckets[i+1] * 1e6
			}
		}
		return -1
	}
	fmt.Fprintf(&b, " | sched-lat(n=%d) P50 %.0f P90 %.0f P99 %.0f P99.9 %.0f µs\n", tot, q(.5), q(.9), q(.99), q(.999))
	os.Stderr.Write(b.Bytes())
}

var probeEvery = func() int {
	n, _ := strconv.Atoi(os.Getenv("SLUICE_FIRSTPROBE"))
	if n <= 0 {
		n = 2000
	}
	return n
}()

var probeNoStartHelp = os.Getenv("SLUICE_NOSTARTHELP") != "" // TEMPORARY
