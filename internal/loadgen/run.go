package loadgen

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// connectBackoff is how long a closed-loop worker waits after a failed
// dial, so a down target does not turn the loop into a busy spin.
const connectBackoff = 10 * time.Millisecond

// Run measures cfg against cfg.Target (and cfg.Compare, interleaved, when
// set) and returns the report. progress, when not nil, receives a live
// progress line about twice a second: redrawn with \r on a terminal, one
// line per update otherwise. If ctx is cancelled mid-run, Run returns the
// report of what was measured together with an error wrapping ctx.Err().
// cfg.Sweep is ignored (see Sweep).
func Run(ctx context.Context, cfg Config, progress io.Writer) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	cfg = cfg.withDefaults()
	targets, err := openTargets(cfg)
	if err != nil {
		return nil, err
	}
	defer closeTargets(targets)
	started := time.Now()
	lv := startLive(progress)
	var ms []measurement
	if cfg.Compare != "" {
		ms = runCompare(ctx, cfg, targets, lv)
	} else {
		ms = []measurement{runSingle(ctx, cfg, targets[0], lv)}
	}
	lv.stop()
	rep := buildReport(cfg, started, targets, ms)
	if err := ctx.Err(); err != nil {
		return rep, fmt.Errorf("run interrupted: %w", err)
	}
	return rep, nil
}

// target is one measured endpoint.
type target struct {
	index    int
	role     string
	url      string
	protocol Protocol
	req      requester
	wl       *workload
	seq      atomic.Int64
}

func openTargets(cfg Config) ([]*target, error) {
	wl, err := newWorkload(cfg)
	if err != nil {
		return nil, err
	}
	type spec struct {
		role, url   string
		p           Protocol
		noKeepAlive bool
	}
	specs := []spec{{"target", cfg.Target, cfg.Protocol, cfg.NoKeepAlive}}
	if cfg.Compare != "" {
		specs = append(specs, spec{"baseline", cfg.Compare, cfg.CompareProtocol, false})
	}
	var ts []*target
	for i, s := range specs {
		req, err := newRequester(cfg, s.url, s.p, s.noKeepAlive)
		if err != nil {
			closeTargets(ts)
			return nil, fmt.Errorf("%s %s: %w", s.role, s.url, err)
		}
		ts = append(ts, &target{index: i, role: s.role, url: s.url, protocol: s.p, req: req, wl: wl})
	}
	return ts, nil
}

func closeTargets(ts []*target) {
	for _, t := range ts {
		_ = t.req.close()
	}
}

// measurement is everything measured for one target.
type measurement struct {
	results   []Result
	wall      time.Duration
	allTokens int64 // including warm-up, for CPU per token
	cpu       map[int]time.Duration
	cpuErr    map[int]string
	genCPU    time.Duration
	genCPUErr bool // a reading of genCPU failed
}

func (m *measurement) add(out phaseOut, cpu cpuSample) {
	m.results = append(m.results, out.results...)
	m.wall += out.wall
	m.allTokens += out.allTokens
	m.genCPU += cpu.gen
	m.genCPUErr = m.genCPUErr || !cpu.genOK
	if m.cpu == nil {
		m.cpu, m.cpuErr = map[int]time.Duration{}, map[int]string{}
	}
	for pid, d := range cpu.used {
		m.cpu[pid] += d
	}
	for pid, e := range cpu.errs {
		m.cpuErr[pid] = e
	}
}

func runSingle(ctx context.Context, cfg Config, t *target, lv *live) measurement {
	var m measurement
	ph := newPhase(cfg, t, cfg.Warmup, cfg.Duration, cfg.Requests, 0)
	ph.label = t.role
	if cfg.label != "" {
		ph.label = cfg.label
	}
	before := readCPU(cfg.PIDs)
	out := runPhase(ctx, ph, lv)
	m.add(out, readCPU(cfg.PIDs).since(before))
	return m
}

func newPhase(cfg Config, t *target, warmup, d time.Duration, n int, round int) phase {
	return phase{
		t: t, warmup: warmup, duration: d, requests: n,
		conc: cfg.Concurrency, rate: cfg.Rate, seed: uint64(cfg.Seed) + uint64(round),
		timeout: cfg.Timeout, drain: cfg.Drain, maxInFlight: cfg.MaxInFlight, ramp: cfg.Ramp,
	}
}

// phase is one bounded stretch of load against one target.
type phase struct {
	t           *target
	label       string
	warmup      time.Duration
	duration    time.Duration // 0: bounded by requests only
	requests    int           // 0: bounded by duration only
	conc        int
	rate        float64 // > 0: open loop
	seed        uint64
	timeout     time.Duration
	drain       time.Duration
	maxInFlight int
	ramp        time.Duration // closed loop: worker starts spread over it
}

type phaseOut struct {
	results   []Result // measured requests only
	wall      time.Duration
	allTokens int64
}

// phaseRun is the state of a running phase.
type phaseRun struct {
	phase
	lv                          *live
	start, measureStart, stopAt time.Time
	stop                        context.CancelFunc // ends arrivals
	taken                       atomic.Int64
	inflight                    atomic.Int64
	mu                          sync.Mutex
	results                     []Result
}

// runPhase runs ph to its bound, lets requests in flight finish for up to
// ph.drain, then cancels the rest.
func runPhase(ctx context.Context, ph phase, lv *live) phaseOut {
	pr := &phaseRun{phase: ph, lv: lv, start: time.Now()}
	warm := ph.warmup
	if ph.rate <= 0 {
		warm = max(warm, ph.ramp) // the ramp is never measured
	}
	pr.measureStart = pr.start.Add(warm)
	if ph.duration > 0 {
		pr.stopAt = pr.measureStart.Add(ph.duration)
	}
	stopCtx, stop := stopContext(ctx, pr.stopAt)
	defer stop()
	pr.stop = stop
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	lv.setPhase(pr)

	var wg sync.WaitGroup
	if ph.rate > 0 {
		wg.Add(1)
		go pr.openLoop(stopCtx, runCtx, &wg)
	} else {
		n := max(ph.conc, 1)
		for i := range n {
			wg.Add(1)
			at := pr.start.Add(time.Duration(float64(ph.ramp) * float64(i) / float64(n)))
			go pr.closedWorker(stopCtx, runCtx, &wg, at)
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-stopCtx.Done():
		drain := time.NewTimer(ph.drain)
		defer drain.Stop()
		select {
		case <-done:
		case <-drain.C:
			cancelRun()
			<-done
		}
	}
	return pr.output(time.Now())
}

// stopContext ends at stopAt, or only when cancelled if stopAt is zero.
func stopContext(ctx context.Context, stopAt time.Time) (context.Context, context.CancelFunc) {
	if stopAt.IsZero() {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, stopAt)
}

// take claims one measured request; false when the count is used up.
func (pr *phaseRun) take() bool {
	if pr.requests <= 0 {
		return true
	}
	n := pr.taken.Add(1)
	if n >= int64(pr.requests) {
		pr.stop() // no arrivals after this one
	}
	return n <= int64(pr.requests)
}

// closedWorker waits until startAt (the ramp), then sends requests back
// to back until the phase ends.
func (pr *phaseRun) closedWorker(stopCtx, runCtx context.Context, wg *sync.WaitGroup, startAt time.Time) {
	defer wg.Done()
	if time.Until(startAt) > 0 {
		timer := time.NewTimer(time.Hour)
		ok := sleepUntil(stopCtx, timer, startAt)
		timer.Stop()
		if !ok {
			return
		}
	}
	for stopCtx.Err() == nil {
		warm := time.Now().Before(pr.measureStart)
		if !warm && !pr.take() {
			return
		}
		pr.inflight.Add(1)
		res := pr.send(runCtx, warm, time.Time{})
		pr.inflight.Add(-1)
		if res.Class == ClassConnect {
			sleepCtx(stopCtx, connectBackoff)
		}
	}
}

// openLoop schedules Poisson arrivals, independent of completions.
func (pr *phaseRun) openLoop(stopCtx, runCtx context.Context, wg *sync.WaitGroup) {
	defer wg.Done()
	arr := newPoisson(pr.seed, pr.rate)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	next := pr.start
	for {
		next = next.Add(arr.next())
		if !pr.stopAt.IsZero() && !next.Before(pr.stopAt) {
			return
		}
		if !sleepUntil(stopCtx, timer, next) {
			return
		}
		warm := next.Before(pr.measureStart)
		if !warm && !pr.take() {
			return
		}
		if pr.inflight.Load() >= int64(pr.maxInFlight) {
			pr.record(Result{Target: pr.t.index, Warmup: warm, Class: ClassDropped,
				Start: time.Since(pr.start), Err: "open loop over max-inflight"})
			continue
		}
		pr.inflight.Add(1)
		wg.Add(1)
		go pr.openRequest(runCtx, wg, warm, next)
	}
}

func (pr *phaseRun) openRequest(ctx context.Context, wg *sync.WaitGroup, warm bool, at time.Time) {
	defer wg.Done()
	defer pr.inflight.Add(-1)
	pr.send(ctx, warm, at)
}

// send performs the next request of the workload and records it.
func (pr *phaseRun) send(runCtx context.Context, warm bool, scheduled time.Time) Result {
	j := pr.t.wl.job(pr.t.seq.Add(1))
	res := Result{Target: pr.t.index, Seq: j.Seq, Warmup: warm, PromptTokens: j.PromptTokens, MaxTokens: j.MaxTokens}
	now := time.Now()
	res.Start = now.Sub(pr.start)
	if !scheduled.IsZero() {
		res.Lag = max(now.Sub(scheduled), 0)
	}
	ctx, cancel := context.WithTimeoutCause(runCtx, pr.timeout, errRequestTimeout)
	pr.lv.sent.Add(1)
	pr.t.req.do(ctx, &j, &res)
	cancel()
	pr.record(res)
	return res
}

func (pr *phaseRun) record(res Result) {
	pr.lv.count(&res)
	pr.mu.Lock()
	pr.results = append(pr.results, res)
	pr.mu.Unlock()
}

func (pr *phaseRun) output(end time.Time) phaseOut {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	out := phaseOut{wall: max(end.Sub(pr.measureStart), 0)}
	for _, r := range pr.results {
		out.allTokens += int64(r.TokensOut)
		if !r.Warmup {
			out.results = append(out.results, r)
		}
	}
	return out
}

// poisson draws the exponential gaps between arrivals of a Poisson process.
type poisson struct {
	r    *rand.Rand
	rate float64 // arrivals per second
}

func newPoisson(seed uint64, rate float64) *poisson {
	return &poisson{r: rand.New(rand.NewPCG(seed, 0x5eed_a771_7a15)), rate: rate}
}

func (p *poisson) next() time.Duration {
	return time.Duration(p.r.ExpFloat64() / p.rate * float64(time.Second))
}

// sleepUntil waits for t; false if ctx ended first.
func sleepUntil(ctx context.Context, timer *time.Timer, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer.Reset(d)
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// cpuSample is CPU time read from /proc for the given pids and this process.
type cpuSample struct {
	used  map[int]time.Duration
	errs  map[int]string
	gen   time.Duration
	genOK bool // gen was read
}

func readCPU(pids []int) cpuSample {
	s := cpuSample{used: map[int]time.Duration{}, errs: map[int]string{}}
	for _, pid := range pids {
		d, err := ProcCPU(pid)
		if err != nil {
			s.errs[pid] = err.Error()
			continue
		}
		s.used[pid] = d
	}
	gen, err := ProcCPU(os.Getpid())
	s.gen, s.genOK = gen, err == nil // fails when out of file descriptors
	return s
}

// since returns the CPU used between before and s.
func (s cpuSample) since(before cpuSample) cpuSample {
	out := cpuSample{used: map[int]time.Duration{}, errs: map[int]string{}}
	if s.genOK && before.genOK {
		out.gen, out.genOK = s.gen-before.gen, true
	}
	for pid, e := range s.errs {
		out.errs[pid] = e
	}
	for pid, d := range s.used {
		if b, ok := before.used[pid]; ok {
			out.used[pid] = d - b
		}
	}
	for pid, e := range before.errs {
		out.errs[pid] = e
	}
	return out
}
