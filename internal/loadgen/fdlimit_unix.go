//go:build unix

package loadgen

import "syscall"

// openFileLimit returns the soft RLIMIT_NOFILE of this process.
func openFileLimit() (uint64, bool) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, false
	}
	return uint64(r.Cur), true
}
