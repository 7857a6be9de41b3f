package loadgen

import (
	"errors"
	"fmt"
	"math"
	"syscall"
)

// fdHint is appended to the message of an error caused by running out of
// file descriptors, so the report says what to do about it.
const fdHint = " (the load generator ran out of file descriptors: raise the limit with ulimit -n, e.g. ulimit -n 65536)"

// errText is err's message, with fdHint when err is EMFILE or ENFILE.
func errText(err error) string {
	if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
		return err.Error() + fdHint
	}
	return err.Error()
}

// fdsNeeded estimates the file descriptors a closed-loop HTTP/1.1 run of
// cfg holds at its peak: one connection per stream per target (a
// comparison keeps the idle connections of the target not being measured)
// plus a margin. Zero when the estimate does not apply (open loop, or a
// protocol that multiplexes streams over few connections). streams is the
// peak concurrency.
func fdsNeeded(cfg Config) (need uint64, streams int) {
	if cfg.Protocol != H1 || cfg.Rate > 0 || cfg.Sweep.Kind == SweepRate {
		return 0, 0
	}
	streams = cfg.Concurrency
	if cfg.Sweep.Kind == SweepConcurrency {
		for _, v := range cfg.Sweep.Values {
			streams = max(streams, int(math.Ceil(v)))
		}
	}
	targets := 1
	if cfg.Compare != "" {
		targets = 2
	}
	return uint64(streams*targets) + 64, streams
}

// fdWarning returns a warning when the open-file limit is below what cfg
// (with defaults applied) needs (see fdsNeeded), or "" when it is not or
// cannot be read. Go raises the soft limit to the hard limit at start-up,
// so this compares against what the process can really use.
func fdWarning(cfg Config) string {
	need, streams := fdsNeeded(cfg)
	limit, ok := openFileLimit()
	if need == 0 || !ok || limit >= need {
		return ""
	}
	return fmt.Sprintf("concurrency %d needs about %d file descriptors but the open-file limit is %d: "+
		"connections beyond it fail with \"too many open files\"; raise it with ulimit -n (e.g. ulimit -n %d)",
		streams, need, limit, max(need*2, 65536))
}
