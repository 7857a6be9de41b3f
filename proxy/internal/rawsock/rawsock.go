// Package rawsock reads and writes a connected, non-blocking socket with
// raw system calls (RawSyscall) inside its syscall.RawConn's Read and
// Write callbacks, keeping the netpoller's semantics: a call that would
// block (EAGAIN) parks the goroutine in the netpoller, deadlines and Close
// end the wait as they end a net.Conn's.
//
// Why: net.Conn's Read and Write enter their system calls through the
// runtime (syscall.Syscall: entersyscall, exitsyscall). On a loopback
// socket a write that wakes its reader takes 17–90 µs, longer than
// sysmon's 20 µs tick; the first such call after the process went idle
// wakes sysmon from its deep sleep and puts it back on 20 µs polls
// (runtime/proc.go: entersyscall → entersyscallWakeSysmon; sysmon resets
// idle and delay after a syscall wake), and a call that spans a tick while
// goroutines wait may have its P retaken (retake → handoffp → a futex
// wake of another M), after which exitsyscall misses its fast path. The
// event loops (proxy/evloop/raw.go) and the QUIC socket
// (proxy/listen/udpraw_linux.go) avoid this the same way. A raw call
// holds its P for the call (a few µs, a copy of at most the caller's
// buffer): the garbage collector's stop-the-world waits that long at
// worst. Never use it on a file or anything that can block.
package rawsock

import "os"

// Env names the environment variable that turns raw socket calls off
// ("0", read once at start): every connection then reads and writes
// through its net.Conn.
const Env = "SLUICE_RAW_SOCKETS"

// On reports whether raw socket calls are on (SLUICE_RAW_SOCKETS is not
// "0").
var On = os.Getenv(Env) != "0"
