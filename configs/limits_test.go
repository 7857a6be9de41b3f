package configs

import (
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// aliasBomb is a billion-laughs config: each level lists the one before
// ten times, so nine levels stand for 10^9 strings in about 1 KB.
func aliasBomb() string {
	var b strings.Builder
	b.WriteString(valid + "tenants:\n  - id: t0\n    limits: &l0 {max_concurrency: 1}\n")
	for i := 1; i <= 9; i++ {
		prev := "*l" + string(rune('0'+i-1))
		b.WriteString("  - id: t" + string(rune('0'+i)) + "\n    limits: &l" + string(rune('0'+i)) + "\n      models:\n")
		for j := 0; j < 10; j++ {
			b.WriteString("        m" + string(rune('0'+j)) + ": " + prev + "\n")
		}
	}
	return b.String()
}

// TestConfigAliasBombRefused: a ~1 KB alias bomb is refused quickly and
// with bounded memory, on load and so on reload (which parses the same way).
func TestConfigAliasBombRefused(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	_, err := Parse("bomb.yaml", []byte(aliasBomb()))
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("alias bomb accepted")
	}
	if took > 3*time.Second {
		t.Errorf("refusing the bomb took %v; want under 3s", took)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 256<<20 {
		t.Errorf("refusing the bomb allocated %d MB; want under 256 MB", grew>>20)
	}
	t.Logf("refused in %v, %d MB allocated: %.200v", took, (after.TotalAlloc-before.TotalAlloc)>>20, err)
}

// TestConfigDeepNestingRefused: deeply nested flow collections and
// oversized files are refused before the YAML parser sees them.
func TestConfigDeepNestingRefused(t *testing.T) {
	deep := valid + "x: " + strings.Repeat("[", 50000) + strings.Repeat("]", 50000) + "\n"
	start := time.Now()
	_, err := Parse("deep.yaml", []byte(deep))
	if err == nil || !strings.Contains(err.Error(), "nested deeper") {
		t.Fatalf("got %v; want a nesting refusal", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("took %v; want under 1s", took)
	}
	big := valid + "# " + strings.Repeat("x", MaxFileBytes) + "\n"
	if _, err := Parse("big.yaml", []byte(big)); err == nil || !strings.Contains(err.Error(), "the limit is") {
		t.Fatalf("got %v; want a size refusal", err)
	}
	if _, err := ParseTenants("t.yaml", []byte("tenants: "+strings.Repeat("{a: ", 100)+"}")); err == nil ||
		!strings.Contains(err.Error(), "nested deeper") {
		t.Fatalf("tenants file: got %v; want a nesting refusal", err)
	}
}

// TestAttackConfigBlockNesting: 200 KB of compact block sequences
// ("- - - ... x", 100,000 levels deep) made the YAML parser take 44 s and
// 15 GB (its cost grows with the square of the depth). Refused before
// parsing, quickly and with little memory. Fails on the old code: the
// 20,000-level version alone took 1.6 s and 677 MB.
func TestAttackConfigBlockNesting(t *testing.T) {
	cases := map[string]string{
		"compact sequences": valid + "x:\n  " + strings.Repeat("- ", 100_000) + "x\n",
		"indented mappings": func() string {
			var b strings.Builder
			b.WriteString(valid + "x:\n")
			for i := 1; i <= 500; i++ {
				b.WriteString(strings.Repeat(" ", i) + "a:\n")
			}
			return b.String()
		}(),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			start := time.Now()
			_, err := Parse("deep.yaml", []byte(data))
			took := time.Since(start)
			runtime.ReadMemStats(&after)
			if err == nil || !strings.Contains(err.Error(), "block collections nested deeper than 64") {
				t.Fatalf("got %.300v; want a block nesting refusal", err)
			}
			if took > 500*time.Millisecond {
				t.Errorf("refusing took %v; want under 500ms", took)
			}
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
				t.Errorf("refusing allocated %d MB; want under 16 MB", grew>>20)
			}
		})
	}
	if _, err := ParseTenants("t.yaml", []byte("tenants:\n  "+strings.Repeat("- ", 1000)+"x\n")); err == nil ||
		!strings.Contains(err.Error(), "block collections nested deeper") {
		t.Fatalf("tenants file: got %v; want a block nesting refusal", err)
	}
}

// TestBlockDepthAcceptsRealFiles: the depth scan does not refuse what real
// configs hold: block scalars with deeply indented text, comments, nesting
// up to the limit.
func TestBlockDepthAcceptsRealFiles(t *testing.T) {
	var b strings.Builder
	b.WriteString("a: |\n")
	for i := 1; i <= 200; i++ {
		b.WriteString(strings.Repeat(" ", i) + "- text, not structure\n")
	}
	b.WriteString("b: >-\n  x\n")
	b.WriteString("c:\n" + strings.Repeat("  ", 10) + "# comment\n")
	b.WriteString("d:\n  " + strings.Repeat("- ", MaxBlockDepth-2) + "x\n")
	if line := blockTooDeep([]byte(b.String())); line != 0 {
		t.Fatalf("refused line %d of a file within the limit", line)
	}
	if line := blockTooDeep([]byte("d:\n  " + strings.Repeat("- ", MaxBlockDepth-1) + "x\n")); line != 2 {
		t.Fatalf("got line %d; want line 2 refused", line)
	}
	for _, name := range []string{"default.yaml", "examples/many-tenants.yaml", "examples/multi-pool.yaml", "examples/redis.yaml", "examples/single-pop.yaml", "examples/tenants/tenants.yaml"} {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if msg := precheck(data); msg != "" {
			t.Errorf("%s: %s", name, msg)
		}
	}
}

// TestAttackConfigAliasBombBeforeDecoding: an alias bomb is refused from
// the syntax tree, before anything is decoded, with a message naming alias
// expansion. (The old code refused it too, later, by counting decoded
// values; this message did not exist.)
func TestAttackConfigAliasBombBeforeDecoding(t *testing.T) {
	start := time.Now()
	_, err := Parse("bomb.yaml", []byte(aliasBomb()))
	if err == nil || !strings.Contains(err.Error(), "once aliases are expanded") {
		t.Fatalf("got %.300v; want an alias expansion refusal", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("took %v; want under 1s", took)
	}
	small := valid + "tenants:\n  - id: a\n    keys: [sha256:246c6a889938d703aa7ba351c2a6abcbba304db0c338c25b9939a23cafb13851]\n    limits: &l {max_concurrency: 1}\n  - id: b\n    keys: [sha256:ef689e186280cc877d8e1e52f0f160abf02f87bbf9450a91b1aa2a1ea2d3d7e7]\n    limits: *l\n"
	if _, err := Parse("ok.yaml", []byte(small)); err != nil {
		t.Fatalf("a file using an alias once was refused: %v", err)
	}
}

// TestListenerCapKeys: the connection caps and timeouts are config keys
// with the documented defaults, and bad values are refused at their
// position.
func TestListenerCapKeys(t *testing.T) {
	c, err := Parse("ok.yaml", []byte(valid))
	if err != nil {
		t.Fatal(err)
	}
	l := c.Listeners
	if l.MaxConnsPerAddr != 1024 || l.FirstRequestTimeout != 10*time.Second || l.IdleTimeout != 2*time.Minute {
		t.Fatalf("defaults: got %d %v %v; want 1024 10s 2m", l.MaxConnsPerAddr, l.FirstRequestTimeout, l.IdleTimeout)
	}
	set := strings.Replace(valid, "listeners:\n", "listeners:\n  max_conns_per_addr: 8\n  first_request_timeout: 3s\n  idle_timeout: 30s\n"+
		"  https:\n    addr: 127.0.0.1:8443\n    dev_cert: true\n    http3: {max_conns_per_addr: 5, max_handshakes: 64, max_handshakes_per_addr: 3}\n", 1)
	c, err = Parse("set.yaml", []byte(set))
	if err != nil {
		t.Fatal(err)
	}
	l = c.Listeners
	if l.MaxConnsPerAddr != 8 || l.FirstRequestTimeout != 3*time.Second || l.IdleTimeout != 30*time.Second ||
		l.HTTPS.HTTP3.MaxConnsPerAddr != 5 || l.HTTPS.HTTP3.MaxHandshakes != 64 || l.HTTPS.HTTP3.MaxHandshakesPerAddr != 3 {
		t.Fatalf("got %+v %+v", l, l.HTTPS.HTTP3)
	}
	bad := strings.Replace(valid, "listeners:\n", "listeners:\n  max_conns_per_addr: -1\n  first_request_timeout: 1ms\n"+
		"  https:\n    addr: 127.0.0.1:8443\n    dev_cert: true\n    http3: {max_handshakes: -3}\n", 1)
	_, err = Parse("bad.yaml", []byte(bad))
	for _, want := range []string{"2:23: listeners.max_conns_per_addr", "3:26: listeners.first_request_timeout", "listeners.https.http3.max_handshakes:"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v; want an error %q", err, want)
		}
	}
}

// TestWebSocketCapKeys: the socket caps are keys of proxy.websocket with
// their documented defaults; negative values are refused.
func TestWebSocketCapKeys(t *testing.T) {
	c, err := Parse("ok.yaml", []byte(valid))
	if err != nil {
		t.Fatal(err)
	}
	if w := c.Proxy.WebSocket; w.MaxSocketsPerAddr != 256 || w.MaxSocketsPerTenant != 1024 {
		t.Fatalf("defaults: got %d %d; want 256 1024", w.MaxSocketsPerAddr, w.MaxSocketsPerTenant)
	}
	c, err = Parse("set.yaml", []byte(valid+"proxy:\n  websocket: {max_sockets_per_addr: 4, max_sockets_per_tenant: 9}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if w := c.Proxy.WebSocket; w.MaxSocketsPerAddr != 4 || w.MaxSocketsPerTenant != 9 {
		t.Fatalf("got %d %d; want 4 9", w.MaxSocketsPerAddr, w.MaxSocketsPerTenant)
	}
	_, err = Parse("bad.yaml", []byte(valid+"proxy:\n  websocket: {max_sockets_per_tenant: -1}\n"))
	if err == nil || !strings.Contains(err.Error(), "proxy.websocket.max_sockets_per_tenant: must not be negative") {
		t.Fatalf("got %v; want a refusal of the negative cap", err)
	}
}

// TestAttackConfigManyValues: a 4 MiB file of a million tiny values made
// the YAML parser take 9 s and 1.3 GB (a flow-list file 11 s and 1.6 GB)
// before the decoder's value count could refuse it. The estimate made
// before parsing refuses it in milliseconds. Fails on the old code: the
// refusal came from the decoder, after the parse (and allocated 1.3 GB).
func TestAttackConfigManyValues(t *testing.T) {
	for name, line := range map[string]string{"block list": "- 1\n", "flow lists": "- [1,2,3,4,5,6,7,8,9,0]\n"} {
		t.Run(name, func(t *testing.T) {
			data := valid + "x:\n" + strings.Repeat(line, (MaxFileBytes-1000)/len(line))
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			start := time.Now()
			_, err := Parse("many.yaml", []byte(data))
			took := time.Since(start)
			runtime.ReadMemStats(&after)
			if err == nil || !strings.Contains(err.Error(), "counted before parsing") {
				t.Fatalf("got %.300v; want a refusal before parsing", err)
			}
			// The time is logged, not asserted (a shared machine under load
			// stretches it); the allocation bound below is what fails on the
			// old code (1.3 GB parsed before the refusal).
			t.Logf("refused in %v", took)
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 32<<20 {
				t.Errorf("refusing allocated %d MB; want under 32 MB", grew>>20)
			}
		})
	}
}

// TestValueEstimateBelowDecoded: the estimate made before parsing never
// exceeds what the decoder counts on real files, so it refuses nothing the
// decoder's own MaxNodes bound would accept.
func TestValueEstimateBelowDecoded(t *testing.T) {
	for _, name := range []string{"default.yaml", "examples/many-tenants.yaml", "examples/multi-pool.yaml",
		"examples/redis.yaml", "examples/redis-cluster.yaml", "examples/single-pop.yaml"} {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		_, est := scanBlocks(data)
		d := newDecoder(name)
		d.parse(data, &Config{})
		if len(d.errs) > 0 || est > d.nodes || est == 0 {
			t.Errorf("%s: estimate %d, decoded %d values, errors %v", name, est, d.nodes, d.errs)
		}
	}
}
