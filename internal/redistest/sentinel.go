package redistest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// MasterName is the name the sentinels of StartSentinel monitor.
const MasterName = "m"

// SentinelSet is a real Redis Sentinel set-up: one master, one replica
// and three sentinels (quorum 2), all private loopback processes stopped
// when the test ends.
type SentinelSet struct {
	tb testing.TB
	// Master and Replica are the data nodes as started; after a failover
	// the replica is the master (see CurrentMaster).
	Master, Replica *Server
	// Sentinels are the three sentinel processes.
	Sentinels []*Server

	tls *TLSFiles // StartSentinelTLS
}

// readyTimeout bounds every wait of the set-up and of Failover. It is
// generous: a 2-core machine shared with other tests can make a sentinel
// wait seconds for a CPU.
const readyTimeout = 30 * time.Second

// StartSentinel starts a master, a replica of it (--replicaof) and three
// sentinels, each with its own config file in a temporary directory
// (`sentinel monitor m 127.0.0.1 PORT 2`, down-after-milliseconds 1000,
// failover-timeout 3000, resolve-hostnames no). It returns when the
// replica is in sync and every sentinel knows the replica and the two
// other sentinels, so a failover can start at once.
func StartSentinel(tb testing.TB) *SentinelSet {
	tb.Helper()
	return startSentinel(tb, nil)
}

// StartSentinelTLS is StartSentinel with TLS everywhere a client goes: the
// data nodes and the sentinels also listen with TLS (f's server
// certificate, tls-auth-clients no), replication and the sentinels' own
// links use TLS (tls-replication yes), and the sentinels name the TLS
// ports (replica-announce-port, sentinel announce-port), so a client
// that asks them gets TLS addresses only. The plain ports stay open for
// Do and the set-up's checks.
func StartSentinelTLS(tb testing.TB, f TLSFiles) *SentinelSet {
	tb.Helper()
	return startSentinel(tb, &f)
}

func tlsArgs(f *TLSFiles, port int) []string {
	return []string{"--tls-port", strconv.Itoa(port), "--tls-cert-file", f.ServerCert, "--tls-key-file", f.ServerKey,
		"--tls-ca-cert-file", f.CA, "--tls-auth-clients", "no", "--tls-replication", "yes"}
}

// startData starts a data node, with TLS when f is set; replicaOf is the
// master (nil: none).
func (ss *SentinelSet) startData(replicaOf *Server) *Server {
	tb := ss.tb
	tb.Helper()
	var args []string
	tlsPort := 0
	if ss.tls != nil {
		p, err := freePort(false)
		if err != nil {
			tb.Fatalf("redistest: %v", err)
		}
		tlsPort = p
		args = append(tlsArgs(ss.tls, p), "--replica-announce-port", strconv.Itoa(p))
	}
	if replicaOf != nil {
		mport := replicaOf.Port()
		if ss.tls != nil {
			mport = replicaOf.tlsPort
		}
		args = append(args, "--replicaof", "127.0.0.1", strconv.Itoa(mport))
	}
	s := start(tb, args, false)
	s.tlsPort = tlsPort
	return s
}

func startSentinel(tb testing.TB, f *TLSFiles) *SentinelSet {
	tb.Helper()
	ss := &SentinelSet{tb: tb, tls: f}
	ss.Master = ss.startData(nil)
	ss.Replica = ss.startData(ss.Master)
	if err := waitFor(readyTimeout, func() (bool, string) {
		info, err := ss.Replica.Do("INFO", "replication")
		return err == nil && strings.Contains(info, "master_link_status:up"), info
	}); err != nil {
		tb.Fatalf("redistest: replica not in sync: %v", err)
	}
	for i := 0; i < 3; i++ {
		ss.Sentinels = append(ss.Sentinels, ss.startSentinel())
	}
	if err := waitFor(readyTimeout, func() (bool, string) {
		for _, s := range ss.Sentinels {
			m, err := s.Do("SENTINEL", "MASTER", MasterName)
			if err != nil {
				return false, err.Error()
			}
			f := fields(m)
			if f["num-slaves"] != "1" || f["num-other-sentinels"] != "2" || strings.Contains(f["flags"], "down") {
				return false, m
			}
		}
		return true, ""
	}); err != nil {
		tb.Fatalf("redistest: sentinels not ready: %v", err)
	}
	return ss
}

func (ss *SentinelSet) startSentinel() *Server {
	tb := ss.tb
	tb.Helper()
	var lastErr error
	for attempt := 0; attempt < 8; attempt++ {
		port, err := freePort(false)
		if err != nil {
			lastErr = err
			continue
		}
		dir := tb.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		mport, tlsPort := ss.Master.Port(), 0
		var extra []string
		if ss.tls != nil {
			if tlsPort, err = freePort(false); err != nil {
				lastErr = err
				continue
			}
			mport = ss.Master.tlsPort
			extra = tlsArgs(ss.tls, tlsPort)
		}
		text := fmt.Sprintf("sentinel resolve-hostnames no\n"+
			"sentinel monitor %[1]s 127.0.0.1 %[2]d 2\n"+
			"sentinel down-after-milliseconds %[1]s 1000\n"+
			"sentinel failover-timeout %[1]s 3000\n"+
			"sentinel parallel-syncs %[1]s 1\n", MasterName, mport)
		if tlsPort != 0 {
			text += fmt.Sprintf("sentinel announce-port %d\n", tlsPort)
		}
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			tb.Fatalf("redistest: %v", err)
		}
		s := &Server{tb: tb, port: port, dir: dir, conf: conf, args: extra, tlsPort: tlsPort}
		if err := s.launch(); err != nil {
			lastErr = err
			continue
		}
		tb.Cleanup(s.Stop)
		return s
	}
	tb.Fatalf("redistest: starting a sentinel: %v", lastErr)
	return nil
}

// Addrs are the sentinels' addresses (their TLS ports after
// StartSentinelTLS).
func (ss *SentinelSet) Addrs() []string {
	addrs := make([]string, len(ss.Sentinels))
	for i, s := range ss.Sentinels {
		addrs[i] = s.Addr()
		if ss.tls != nil {
			addrs[i] = s.TLSAddr()
		}
	}
	return addrs
}

// MasterAddr is the master's address as the first sentinel that answers
// knows it (SENTINEL GET-MASTER-ADDR-BY-NAME; its TLS port after
// StartSentinelTLS).
func (ss *SentinelSet) MasterAddr() (string, error) {
	var lastErr error
	for _, s := range ss.Sentinels {
		r, err := s.Do("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MasterName)
		if err != nil {
			lastErr = err
			continue
		}
		hp := strings.Split(r, "\n")
		if len(hp) != 2 {
			lastErr = fmt.Errorf("GET-MASTER-ADDR-BY-NAME: %q", r)
			continue
		}
		return hp[0] + ":" + hp[1], nil
	}
	return "", lastErr
}

// CurrentMaster is the data node every sentinel names master (nil if they
// disagree or none is one of Master and Replica).
func (ss *SentinelSet) CurrentMaster() *Server {
	var addr string
	for _, s := range ss.Sentinels {
		r, err := s.Do("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MasterName)
		if err != nil {
			return nil
		}
		a := strings.Replace(r, "\n", ":", 1)
		if addr != "" && a != addr {
			return nil
		}
		addr = a
	}
	for _, s := range []*Server{ss.Master, ss.Replica} {
		if s.Addr() == addr || s.tlsPort != 0 && s.TLSAddr() == addr {
			return s
		}
	}
	return nil
}

// Failover asks a sentinel for a failover (SENTINEL FAILOVER: no
// agreement needed, the replica is promoted at once) and waits until
// every sentinel names to the new master and the new master says
// role:master. It returns the new master.
func (ss *SentinelSet) Failover() *Server {
	ss.tb.Helper()
	old := ss.CurrentMaster()
	if old == nil {
		ss.tb.Fatalf("redistest: no agreed master before the failover")
	}
	if _, err := ss.Sentinels[0].Do("SENTINEL", "FAILOVER", MasterName); err != nil {
		ss.tb.Fatalf("redistest: SENTINEL FAILOVER: %v", err)
	}
	return ss.WaitNewMaster(old)
}

// WaitNewMaster waits until every sentinel names a master other than old
// and that node says role:master (after Failover, or after old was killed
// and the sentinels agreed on its death: down-after-milliseconds 1000 then
// an election). It returns the new master.
func (ss *SentinelSet) WaitNewMaster(old *Server) *Server {
	ss.tb.Helper()
	var now *Server
	if err := waitFor(readyTimeout, func() (bool, string) {
		now = ss.CurrentMaster()
		if now == nil || now == old {
			return false, "sentinels still name the old master or disagree"
		}
		info, err := now.Do("INFO", "replication")
		return err == nil && strings.Contains(info, "role:master"), info
	}); err != nil {
		ss.tb.Fatalf("redistest: failover did not complete: %v", err)
	}
	return now
}

// waitFor polls ok every 50ms until it holds or timeout passes; the error
// carries ok's last note.
func waitFor(timeout time.Duration, ok func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	for {
		done, note := ok()
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v: %s", timeout, note)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// fields turns a flat name/value reply (joined by newlines) into a map.
func fields(reply string) map[string]string {
	parts := strings.Split(reply, "\n")
	m := make(map[string]string, len(parts)/2)
	for i := 0; i+1 < len(parts); i += 2 {
		m[parts[i]] = parts[i+1]
	}
	return m
}
