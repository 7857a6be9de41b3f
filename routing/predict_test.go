package routing

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func predictPool(t *testing.T) *Pool {
	t.Helper()
	p, err := NewPool(PoolConfig{Name: "p", Policy: PolicyPredictedTTFT, Backends: []BackendConfig{{URL: "http://127.0.0.1:1", MaxBatch: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// learn turns an attempt's marks into the means: an attempt with nobody
// ahead gives the prefill rate, one with requests ahead the queue wait
// per request, and each its prediction error.
func TestPredictLearnsPrefillRateAndQueueWait(t *testing.T) {
	p := predictPool(t)
	b := p.Backends()[0]
	t0 := time.Now()
	// 1000 uncached tokens prefilled in 100 ms after 2 ms of network: 10000 tok/s.
	b.learn(prediction{ok: true, at: 50 * time.Millisecond, tokens: 1200, cached: 200}, t0, t0.Add(2*time.Millisecond), t0.Add(102*time.Millisecond))
	st := b.PredictStats()
	if st.PrefillRate < 9999 || st.PrefillRate > 10001 || st.Network != 2*time.Millisecond {
		t.Fatalf("rate %v network %v; want 10000 tok/s, 2ms", st.PrefillRate, st.Network)
	}
	// 3 ahead, 1000 tokens: 100 ms prefill + 3 × 300 ms.
	b.learn(prediction{ok: true, at: time.Second, tokens: 1000, waiting: 3}, t0, t0.Add(2*time.Millisecond), t0.Add(1002*time.Millisecond))
	st = b.PredictStats()
	if st.QueueWait < 299*time.Millisecond || st.QueueWait > 301*time.Millisecond {
		t.Fatalf("queue wait per request %v; want 300ms", st.QueueWait)
	}
	if st.Errors != 2 || st.ErrP50 != -50*time.Millisecond || st.ErrP95 != -2*time.Millisecond {
		t.Fatalf("errors %d p50 %v p95 %v; want 2, -50ms (bucket of -52ms), -2ms (bucket of -2ms)", st.Errors, st.ErrP50, st.ErrP95)
	}
	// The prediction uses them: 2 ahead, 500 tokens.
	if got, q := b.predict(500, 2); got < 651*time.Millisecond || got > 653*time.Millisecond || q != 600*time.Millisecond {
		t.Fatalf("prediction %v (queue %v); want 2ms + 600ms + 50ms", got, q)
	}
	// A stream whose first event came with its headers teaches nothing.
	b.learn(prediction{ok: true, at: time.Second, tokens: 1000}, t0, t0.Add(time.Millisecond), t0.Add(time.Millisecond))
	if b.PredictStats().Errors != 2 {
		t.Fatal("learnt from a first event at the headers' time")
	}
}

// The objective refuses with Retry-After = ceil(predicted − objective),
// at least 1 s, and counts the refusal.
func TestObjectiveRetryAfterFromPrediction(t *testing.T) {
	p := predictPool(t)
	now := time.Now()
	w := &Want{}
	if err := p.checkObjective(time.Second, prediction{ok: true, at: 900 * time.Millisecond}, w, now); err != nil {
		t.Fatalf("met objective refused: %v", err)
	}
	err := p.checkObjective(time.Second, prediction{ok: true, at: 3200 * time.Millisecond}, w, now)
	if err == nil || RetryAfter(err) != 3*time.Second || !strings.Contains(err.Error(), "TTFT objective") {
		t.Fatalf("err %v retry after %v; want ErrTTFTObjective, 3s", err, RetryAfter(err))
	}
	err = p.checkObjective(time.Second, prediction{ok: true, at: 1100 * time.Millisecond}, w, now)
	if RetryAfter(err) != time.Second || p.ObjectiveRefusals() != 2 {
		t.Fatalf("retry after %v, refusals %d; want 1s, 2", RetryAfter(err), p.ObjectiveRefusals())
	}
}

func TestPredictConfigValidation(t *testing.T) {
	for _, c := range []PredictConfig{{PrefillRate: -1}, {QueueWait: -time.Second}, {Alpha: 1.5}} {
		cfg := PoolConfig{Name: "p", Policy: PolicyPredictedTTFT, Predict: c, Backends: []BackendConfig{{URL: "http://127.0.0.1:1"}}}.WithDefaults()
		errs := cfg.Validate()
		found := false
		for _, e := range errs {
			found = found || strings.HasPrefix(e.Key, "predict.")
		}
		if !found {
			t.Errorf("%+v: no predict.* error in %v", c, errs)
		}
	}
	if errs := (PoolConfig{Name: "p", Policy: PolicyPredictedTTFT, Backends: []BackendConfig{{URL: "http://127.0.0.1:1"}}}).WithDefaults().Validate(); len(errs) != 0 {
		t.Errorf("defaults invalid: %v", errs)
	}
}

// The prediction error is exported as a histogram per backend.
func TestPredictionErrorMetric(t *testing.T) {
	p := predictPool(t)
	b := p.Backends()[0]
	t0 := time.Now()
	b.learn(prediction{ok: true, at: 10 * time.Millisecond, tokens: 100}, t0, t0.Add(time.Millisecond), t0.Add(30*time.Millisecond))
	reg := prometheus.NewRegistry()
	if err := RegisterMetrics(reg, func() []*Pool { return []*Pool{p} }); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "sluice_backend_ttft_prediction_error_seconds" {
			h := mf.GetMetric()[0].GetHistogram()
			if h.GetSampleCount() != 1 || h.GetSampleSum() > -0.019 || h.GetSampleSum() < -0.021 {
				t.Fatalf("count %d sum %v; want 1, -0.02", h.GetSampleCount(), h.GetSampleSum())
			}
			return
		}
	}
	t.Fatal("sluice_backend_ttft_prediction_error_seconds not exported")
}
