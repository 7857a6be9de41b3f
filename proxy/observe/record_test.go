package observe

import "testing"

// The named indexes point at the stages they name, and Timed is the
// header stages followed by decode.
func TestTimedIndexes(t *testing.T) {
	if Timed[TTFT] != StageTTFT || Timed[Decode] != StageDecode {
		t.Fatalf("Timed[TTFT] %q, Timed[Decode] %q; want %q and %q", Timed[TTFT], Timed[Decode], StageTTFT, StageDecode)
	}
	for i, s := range HeaderStages {
		if Timed[i] != s {
			t.Fatalf("Timed[%d] %q; want header stage %q", i, Timed[i], s)
		}
	}
	if len(Timed) != len(HeaderStages)+1 {
		t.Fatalf("%d timed stages; want the %d header stages and decode", len(Timed), len(HeaderStages))
	}
}
