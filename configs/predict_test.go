package configs

import (
	"strings"
	"testing"
	"time"
)

// The TTFT prediction's keys decode and validate: policy predicted_ttft,
// pools[].predict.*, routes[].ttft_objective.
func TestPredictedTTFTKeys(t *testing.T) {
	y := strings.Replace(valid, "    backends:\n", "    policy: predicted_ttft\n    predict:\n      prefill_rate: 8000\n      queue_wait: 30ms\n    backends:\n", 1) +
		"    ttft_objective: 800ms\n"
	c, err := Parse("p.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	p := c.Pools[0]
	if p.Policy != "predicted_ttft" || p.Predict.PrefillRate != 8000 || p.Predict.QueueWait != 30*time.Millisecond || p.Predict.Alpha != 0.2 {
		t.Errorf("pool: policy %q predict %+v", p.Policy, p.Predict)
	}
	if c.Routes[0].TTFTObjective != 800*time.Millisecond {
		t.Errorf("ttft_objective %v", c.Routes[0].TTFTObjective)
	}
	bad := strings.Replace(y, "800ms", "11m", 1)
	bad = strings.Replace(bad, "prefill_rate: 8000", "prefill_rate: -5", 1)
	_, err = Parse("p.yaml", []byte(bad))
	got := ""
	for _, e := range Errors(err) {
		got += e.Error() + "\n"
	}
	for _, want := range []string{"ttft_objective 11m0s must be from 0 (none) to 10m", "predict.prefill_rate must be a positive"} {
		if !strings.Contains(got, want) {
			t.Errorf("errors:\n%s\nwant one containing %q", got, want)
		}
	}
}
