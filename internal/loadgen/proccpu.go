package loadgen

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

// ProcCPU returns the CPU time (user + system, all threads) that process
// pid has used so far, read from /proc/<pid>/stat (utime + stime). Linux
// only; the resolution is one clock tick (AT_CLKTCK, usually 10 ms), so
// measure over runs long enough for that to be small.
func ProcCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("reading cpu time of pid %d: %w", pid, err)
	}
	ticks, err := parseProcStat(b)
	if err != nil {
		return 0, fmt.Errorf("pid %d: %w", pid, err)
	}
	return time.Duration(ticks) * time.Second / time.Duration(clockTicks()), nil
}

// parseProcStat returns utime + stime in clock ticks. The command name in
// field 2 may hold spaces and parentheses, so fields are counted from the
// last ')'.
func parseProcStat(b []byte) (uint64, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc stat: no command name")
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state); utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, errors.New("malformed /proc stat: too few fields")
	}
	ut, err1 := strconv.ParseUint(string(f[11]), 10, 64)
	st, err2 := strconv.ParseUint(string(f[12]), 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("malformed /proc stat: %w", err)
	}
	return ut + st, nil
}

// clockTicks is the kernel's USER_HZ, from the AT_CLKTCK auxiliary vector
// entry of this process; 100 if it cannot be read.
var clockTicks = sync.OnceValue(func() int64 {
	const atClkTck = 17
	b, err := os.ReadFile("/proc/self/auxv")
	if err != nil || strconv.IntSize != 64 { // entries are two native words
		return 100
	}
	for len(b) >= 16 {
		key, val := binary.NativeEndian.Uint64(b), binary.NativeEndian.Uint64(b[8:])
		if key == atClkTck && val > 0 {
			return int64(val)
		}
		b = b[16:]
	}
	return 100
})
