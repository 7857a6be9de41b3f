//go:build !linux

package observe

import "io"

// rawLogOut returns w: raw log writes are Linux only (rawwrite_linux.go).
func rawLogOut(w io.Writer) io.Writer { return w }
