package main

import (
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/node"
)

// SIGHUP reloads the config (a file that did not change reloads nothing);
// SIGTERM ends the serve loop.
func TestSignals(t *testing.T) {
	tn := startFileNode(t, nodeConfig{}.String())
	attempts := tn.reloadStatus().Attempts
	sigs := make(chan os.Signal, 2)
	sigs <- syscall.SIGHUP
	sigs <- syscall.SIGTERM // handled after the SIGHUP's reload returned
	done := make(chan struct{})
	go func() { defer close(done); serveUntilSignal(tn.n, sigs, discardLog()) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("SIGTERM did not end the serve loop")
	}
	rs := tn.reloadStatus()
	if rs.Attempts != attempts+1 {
		t.Fatalf("reload attempts after SIGHUP: %d; want %d", rs.Attempts, attempts+1)
	}
	if rs.LastAttempt.Trigger != node.TriggerSIGHUP || rs.LastAttempt.Result != node.ResultUnchanged {
		t.Fatalf("SIGHUP: %+v", rs.LastAttempt)
	}
}
