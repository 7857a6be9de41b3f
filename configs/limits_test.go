package configs

import (
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
