package loadgen

import (
	"os"
	"os/exec"
	"testing"
)

func TestParseProcStat(t *testing.T) {
	// The command name may contain spaces and parentheses.
	line := "1234 (my (odd) proc) S 1 1234 1234 0 -1 4194560 500 0 0 0 250 75 0 0 20 0 4 0 100 0 0\n"
	ticks, err := parseProcStat([]byte(line))
	if err != nil || ticks != 325 {
		t.Errorf("parseProcStat = %d, %v; want 325 (250 utime + 75 stime)", ticks, err)
	}
	for _, bad := range []string{"", "1 (x) S 1 2", "1 (x) S 1 2 3 4 5 6 7 8 9 10 abc 5"} {
		if _, err := parseProcStat([]byte(bad)); err == nil {
			t.Errorf("parseProcStat(%q) succeeded", bad)
		}
	}
}

func TestProcCPU(t *testing.T) {
	before, err := ProcCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for i := range 50_000_000 { // burn some CPU
		x ^= i * 31
	}
	_ = x
	after, err := ProcCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after < before || after <= 0 {
		t.Errorf("cpu time went from %v to %v", before, after)
	}
	if clockTicks() <= 0 {
		t.Errorf("clock ticks %d", clockTicks())
	}
	// A process that has exited and been reaped has no /proc entry.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if _, err := ProcCPU(cmd.Process.Pid); err == nil {
		t.Error("ProcCPU of a reaped process succeeded")
	}
}
