package loadgen

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// progressEvery is the refresh interval of the live progress line.
const progressEvery = 500 * time.Millisecond

// live counts requests as they end and, when it has a writer, prints a
// progress line until stopped. Its counters are updated atomically by the
// request goroutines.
type live struct {
	sent, done, ok, limited, failed, truncated, tokens atomic.Int64

	ph atomic.Pointer[phaseRun]

	w        io.Writer
	redraw   bool // terminal: redraw one line with \r
	quit     chan struct{}
	finished chan struct{}
	once     sync.Once
}

// startLive starts the progress printer; w == nil prints nothing.
func startLive(w io.Writer) *live {
	lv := &live{w: w, quit: make(chan struct{}), finished: make(chan struct{})}
	if w == nil {
		close(lv.finished)
		return lv
	}
	if f, ok := w.(*os.File); ok {
		lv.redraw = isTerminal(f)
	}
	go lv.printLoop()
	return lv
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func (lv *live) setPhase(pr *phaseRun) { lv.ph.Store(pr) }

// count adds one finished request.
func (lv *live) count(r *Result) {
	lv.done.Add(1)
	lv.tokens.Add(int64(r.TokensOut))
	switch r.Class {
	case ClassOK:
		lv.ok.Add(1)
	case ClassHTTP429:
		lv.limited.Add(1)
	case ClassTruncated:
		lv.truncated.Add(1)
	default:
		lv.failed.Add(1)
	}
}

// stop ends the printer (idempotent) and finishes the line.
func (lv *live) stop() {
	lv.once.Do(func() { close(lv.quit) })
	<-lv.finished
}

func (lv *live) printLoop() {
	defer close(lv.finished)
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	var lastTokens int64
	last := time.Now()
	for {
		select {
		case <-lv.quit:
			if lv.redraw {
				fmt.Fprintln(lv.w)
			}
			return
		case now := <-tick.C:
			tok := lv.tokens.Load()
			rate := float64(tok-lastTokens) / now.Sub(last).Seconds()
			lastTokens, last = tok, now
			lv.print(now, rate)
		}
	}
}

func (lv *live) print(now time.Time, tokRate float64) {
	pr := lv.ph.Load()
	if pr == nil {
		return
	}
	label, frac := pr.label, pr.progress(now)
	if now.Before(pr.measureStart) {
		label += " warm-up"
	}
	line := fmt.Sprintf("%-16s %s %5.1fs  sent %d  done %d  in-flight %d | ok %d  429 %d  failed %d  truncated %d | %.0f tok/s",
		label, bar(frac, 20), now.Sub(pr.start).Seconds(), lv.sent.Load(), lv.done.Load(), pr.inflight.Load(),
		lv.ok.Load(), lv.limited.Load(), lv.failed.Load(), lv.truncated.Load(), tokRate)
	if lv.redraw {
		fmt.Fprintf(lv.w, "\r%s\x1b[K", line)
	} else {
		fmt.Fprintln(lv.w, line)
	}
}

// progress is the completed fraction of the phase's bound (0..1).
func (pr *phaseRun) progress(now time.Time) float64 {
	f := 0.0
	if total := pr.warmup + pr.duration; pr.duration > 0 {
		f = float64(now.Sub(pr.start)) / float64(total)
	}
	if pr.requests > 0 {
		f = max(f, float64(pr.taken.Load())/float64(pr.requests))
	}
	return min(max(f, 0), 1)
}

func bar(frac float64, width int) string {
	n := int(frac * float64(width))
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", width-n) + "]"
}
