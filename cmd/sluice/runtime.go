package main

import (
	"bufio"
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
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
// container's or GOMEMLIMIT); without a limit the GC tuner (startGCTuner)
// sets it from the live heap instead. A small non-streamed request
// allocates a few kilobytes that die with it; at 100 the collector runs
// so often that its work, and the scheduling around it, is a large share
// of such a request's CPU (200 cut it by 14 % on target 3: docs/BENCHMARKS.md,
// "smallreq3"). What it costs is a higher heap between collections (up to
// 3 times the live heap, against 2): with a limit in force the collector
// runs as often as it must near the limit, whatever GOGC says, so the
// extra heap is memory the container has to spare; without one nothing
// would bound it but the live heap, and held streams' RSS grew with a
// fixed GOGC (target 4), which is why the tuner raises it only while the
// live heap is small. 200 rather than 400: 400 cut no more CPU and its
// heap may reach 5 times the live heap.
const limitedGOGC = 200

// applyRuntimeDefaults sets Go's soft memory limit from the container's
// memory limit when the environment does not set GOMEMLIMIT, raises the
// collector's target to limitedGOGC when the environment does not set
// GOGC and a memory limit is in force (with neither, it starts the GC
// tuner, startGCTuner, unless SLUICE_GC_HEADROOM=0), and logs the runtime
// settings in force. Without a soft limit the heap grows to (1+GOGC/100)
// times the live heap before a collection, whatever the container's
// limit: a node holding many streams can be killed for memory it would
// have freed. With it, the collector runs harder only when the heap nears the limit, so it
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
	stopGCTuner()                        // a running tuner (a test's earlier serve) would override what is set below
	gogc, gogcSource := os.Getenv("GOGC"), "GOGC"
	var (
		attrs0 []any
		bad    string // SLUICE_GC_HEADROOM when it is not a number
	)
	switch {
	case gogc != "":
	case limited:
		debug.SetGCPercent(limitedGOGC)
		gogc, gogcSource = strconv.Itoa(limitedGOGC), "sluice"
	default:
		gogc, gogcSource = "100", "go" // SLUICE_GC_HEADROOM=0: Go's own
		var h uint64
		if h, bad = gcHeadroom(); bad != "" {
			attrs0 = append(attrs0, "gc_headroom_invalid", bad)
		}
		if h > 0 {
			startGCTuner(h)
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
	level := slog.LevelInfo
	if bad != "" {
		level = slog.LevelWarn // an operator's typo is said, not only logged
	}
	log.Log(context.Background(), level, "go runtime", attrs...)
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

// defaultGCHeadroom is the tuner's headroom when SLUICE_GC_HEADROOM is
// not set: 16 MiB. At a small request load's 1–2 MiB live heap that is
// GOGC 400 (16 MiB between collections instead of Go's 4 MiB minimum: a
// collection every ≈ 1,700 small requests instead of every ≈ 260); at held
// streams' ≈ 100 MiB it is Go's 100. Measured (docs/BENCHMARKS.md,
// "gcdef17"): CPU per small request −15 %, target 1's CPU per token and
// TTFT P50 at 64 streams no worse against a control side of the same
// binary; gc9's rise of target 1's TTFT with it did not reproduce on a
// quiet machine.
const defaultGCHeadroom = 16 << 20

// gcHeadroom is the tuner's headroom: SLUICE_GC_HEADROOM in bytes,
// defaultGCHeadroom when it is unset; 0 turns the tuner off. A value that
// is not a number of bytes is reported in bad and the default used.
func gcHeadroom() (n uint64, bad string) {
	v, ok := os.LookupEnv("SLUICE_GC_HEADROOM")
	if !ok || v == "" {
		return defaultGCHeadroom, ""
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return defaultGCHeadroom, v
	}
	return n, ""
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
// most headroom in all. The tuner is the process's one: it replaces a
// tuner started before (a test's second serve).
func startGCTuner(headroom uint64) {
	t := &gcTuner{headroom: headroom, sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}, cur: 100}
	tuner.Lock()
	defer tuner.Unlock()
	if tuner.t != nil {
		tuner.t.stop()
	}
	tuner.t = t
	t.arm()
}

// stopGCTuner stops the process's tuner, if one runs: after it returns the
// tuner sets the collector's target no more.
func stopGCTuner() {
	tuner.Lock()
	defer tuner.Unlock()
	if tuner.t != nil {
		tuner.t.stop()
		tuner.t = nil
	}
}

// tuner is the process's running gcTuner.
var tuner struct {
	sync.Mutex
	t *gcTuner
}

type gcTuner struct {
	headroom uint64
	sample   []metrics.Sample
	mu       sync.Mutex // held by cycle and stop: no SetGCPercent after stop returns
	cur      int
	stopped  bool
}

func (t *gcTuner) arm() { runtime.SetFinalizer(&gcSentinel{}, t.cycle) }

func (t *gcTuner) stop() {
	t.mu.Lock()
	t.stopped = true
	t.mu.Unlock()
}

// cycle runs on the finalizer goroutine after a collection.
func (t *gcTuner) cycle(*gcSentinel) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
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
