package main

import (
	"bufio"
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
)

// memLimitShare is the share of the container's memory limit that Sluice
// gives the Go runtime as its soft memory limit when GOMEMLIMIT is not set:
// the rest is for memory the runtime does not count (kernel socket
// buffers, which are charged to the container, thread stacks outside Go,
// fragmentation) and for a burst while the collector catches up.
const memLimitShare = 0.9

// limitedGOGC is the collector's target, in percent of the live heap
// allocated between collections, that Sluice sets when the environment
// does not set GOGC and a soft memory limit is in force (from the
// container's or GOMEMLIMIT); Go's own default, 100, stays otherwise. A
// small non-streamed request allocates a few kilobytes that die with it,
// mostly in net/http's two hops; at 100 the collector runs so often that
// its work, and the scheduling around it, is a large share of such a
// request's CPU (200 cut it by 14 % on target 3: docs/BENCHMARKS.md,
// "smallreq3"). What it costs is a higher heap between collections (up to
// 3 times the live heap, against 2): with a limit in force the collector
// runs as often as it must near the limit, whatever GOGC says, so the
// extra heap is memory the container has to spare; without one nothing
// would bound it but the live heap, and held streams' RSS grew with GOGC
// (target 4), so Sluice leaves GOGC alone there. 200 rather than 400: 400
// cut no more CPU and its heap may reach 5 times the live heap.
const limitedGOGC = 200

// applyRuntimeDefaults sets Go's soft memory limit from the container's
// memory limit when the environment does not set GOMEMLIMIT, raises the
// collector's target to limitedGOGC when the environment does not set
// GOGC and a memory limit is in force (with neither, it starts the GC
// tuner when SLUICE_GC_HEADROOM asks for it: startGCTuner), and logs the runtime settings in force. Without
// a soft limit the heap grows to (1+GOGC/100) times the live heap before
// a collection, whatever the container's limit: a node
// holding many streams can be killed for memory it would have freed. With
// it, the collector runs harder only when the heap nears the limit, so it
// costs nothing until memory is short. GOMAXPROCS needs nothing: since Go
// 1.25 the runtime reads the container's CPU limit itself.
func applyRuntimeDefaults(log *slog.Logger) {
	source := "GOMEMLIMIT"
	if os.Getenv("GOMEMLIMIT") == "" {
		source = "none"
		if limit, file := cgroupMemoryLimit("/"); limit > 0 {
			debug.SetMemoryLimit(int64(float64(limit) * memLimitShare))
			source = file
		}
	}
	memLimit := debug.SetMemoryLimit(-1) // -1 reads the limit without changing it
	limited := memLimit < 1<<62          // math.MaxInt64 means none
	gogc, gogcSource := os.Getenv("GOGC"), "GOGC"
	var attrs0 []any
	switch {
	case gogc != "":
	case limited:
		debug.SetGCPercent(limitedGOGC)
		gogc, gogcSource = strconv.Itoa(limitedGOGC), "sluice"
	default:
		gogc, gogcSource = "100", "go" // no limit to bound a higher target
		if h := gcHeadroom(); h > 0 {
			stopGCTuner = startGCTuner(h)
			gogc, gogcSource = "100+headroom", "sluice"
			attrs0 = append(attrs0, "gc_headroom_bytes", h)
		}
	}
	attrs := []any{"gomaxprocs", runtime.GOMAXPROCS(0), "gogc", gogc, "gogc_source", gogcSource,
		"memory_limit_source", source}
	if limited {
		attrs = append(attrs, "memory_limit_bytes", memLimit)
	}
	attrs = append(attrs, attrs0...)
	log.Info("go runtime", attrs...)
}

// cgroupMemoryLimit returns the memory limit of the cgroup this process
// runs in, in bytes, and the file it was read from, or 0 when there is
// none. root is the file system root ("/"; a test directory in tests). It
// reads cgroup v2's memory.max, else v1's memory.limit_in_bytes, first in
// the process's own cgroup (as /proc/self/cgroup names it) and then at the
// hierarchy's root, which is the container's own cgroup when the container
// has a cgroup namespace.
func cgroupMemoryLimit(root string) (int64, string) {
	v2, v1 := selfCgroups(filepath.Join(root, "proc/self/cgroup"))
	base := filepath.Join(root, "sys/fs/cgroup")
	var files []string
	if v2 != "" {
		files = append(files, filepath.Join(base, v2, "memory.max"))
	}
	files = append(files, filepath.Join(base, "memory.max"))
	if v1 != "" {
		files = append(files, filepath.Join(base, "memory", v1, "memory.limit_in_bytes"))
	}
	files = append(files, filepath.Join(base, "memory", "memory.limit_in_bytes"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0, "" // v2: no limit
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			continue
		}
		if n >= 1<<60 { // v1 writes a huge page-rounded number for "no limit"
			return 0, ""
		}
		return n, strings.TrimPrefix(f, filepath.Clean(root))
	}
	return 0, ""
}

// selfCgroups reads /proc/self/cgroup: the cgroup v2 path ("0::/path")
// and the v1 memory controller's path ("N:memory:/path"), "" when absent.
func selfCgroups(file string) (v2, v1mem string) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", ""
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case slices.Contains(strings.Split(parts[1], ","), "memory"):
			v1mem = parts[2]
		}
	}
	return v2, v1mem
}

// gcMaxPercent caps the collector's target the tuner sets.
const gcMaxPercent = 400

// gcHeadroom is the tuner's headroom: SLUICE_GC_HEADROOM in bytes; 0 (unset,
// "0" or not a number): no tuner. It is not on by default: 16 MiB (GOGC
// 400 at a small request load's 2 MiB live heap) cut the CPU per small
// request by ≈ 20 % against Go's 100 and left held streams' RSS as it
// was, where a plain GOGC 200 raised it by 30 %, but it raised target 1's
// TTFT P50 at 64 streams by 0.14–0.18 ms and its CPU per token by 1–7 %
// (docs/BENCHMARKS.md, "gc9").
func gcHeadroom() uint64 {
	n, err := strconv.ParseUint(os.Getenv("SLUICE_GC_HEADROOM"), 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// gcPercentFor is the collector's target for a live heap of live bytes:
// Go's 100 (the heap doubles between collections), raised so that at
// least headroom bytes may be allocated between them, at most
// gcMaxPercent.
func gcPercentFor(live, headroom uint64) int {
	if live == 0 {
		return gcMaxPercent
	}
	p := (headroom*100 + live - 1) / live
	return int(max(100, min(p, gcMaxPercent)))
}

// gcSentinel is an object whose finalizer runs once per collection.
type gcSentinel struct {
	_ *byte // not a tiny allocation: those may share a block and never be finalized alone
	_ [16]byte
}

// startGCTuner sets the collector's target after each collection from the
// live heap it found (gcPercentFor): a process with a small live heap —
// small requests, whose garbage dies with them — collects once per
// headroom bytes allocated instead of once per live heap's size, while a
// large live heap (held streams) keeps Go's 100, so its memory is what it
// was: RSS per held stream does not grow with the headroom, only by at
// most headroom in all.
// It returns a function that stops it after its next cycle (tests).
func startGCTuner(headroom uint64) (stop func()) {
	t := &gcTuner{headroom: headroom, sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}, cur: 100}
	t.arm()
	return func() { t.stopped.Store(true) }
}

// stopGCTuner stops the tuner applyRuntimeDefaults started (tests).
var stopGCTuner = func() {}

type gcTuner struct {
	headroom uint64
	sample   []metrics.Sample
	cur      int
	stopped  atomic.Bool
}

func (t *gcTuner) arm() { runtime.SetFinalizer(&gcSentinel{}, t.cycle) }

// cycle runs on the finalizer goroutine after a collection.
func (t *gcTuner) cycle(*gcSentinel) {
	if t.stopped.Load() {
		return
	}
	metrics.Read(t.sample)
	if t.sample[0].Value.Kind() == metrics.KindUint64 {
		if p := gcPercentFor(t.sample[0].Value.Uint64(), t.headroom); p != t.cur {
			debug.SetGCPercent(p)
			t.cur = p
		}
	}
	t.arm()
}
