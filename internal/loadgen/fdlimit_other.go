//go:build !unix

package loadgen

// openFileLimit is unknown off Unix.
func openFileLimit() (uint64, bool) { return 0, false }
