package loadgen

import (
	"math"
	"testing"
	"time"
)

// TestPoissonInterArrivals checks the gaps of a seeded Poisson process:
// exponential with mean 1/rate and variance 1/rate². With n = 200,000
// samples the standard error of the mean is 0.22% of it and that of the
// variance about 0.5%, so ±2% and ±4% are more than 8 standard errors.
func TestPoissonInterArrivals(t *testing.T) {
	const rate, n = 50.0, 200000
	p := newPoisson(42, rate)
	var sum, sumSq float64
	var over3Means int
	for range n {
		g := p.next().Seconds()
		if g < 0 {
			t.Fatalf("negative gap %v", g)
		}
		sum += g
		sumSq += g * g
		if g > 3/rate {
			over3Means++
		}
	}
	mean := sum / n
	variance := sumSq/n - mean*mean
	if want := 1 / rate; math.Abs(mean-want)/want > 0.02 {
		t.Errorf("mean gap %.6fs; want %.6fs ± 2%%", mean, want)
	}
	if want := 1 / (rate * rate); math.Abs(variance-want)/want > 0.04 {
		t.Errorf("variance %.3g; want %.3g ± 4%% (exponential gaps)", variance, want)
	}
	// P(gap > 3 means) = e^-3 ≈ 4.98%: the tail is exponential, not uniform.
	if frac := float64(over3Means) / n; math.Abs(frac-math.Exp(-3)) > 0.005 {
		t.Errorf("fraction of gaps over 3 means %.4f; want %.4f", frac, math.Exp(-3))
	}
}

func TestPoissonSeeded(t *testing.T) {
	a, b, c := newPoisson(7, 10), newPoisson(7, 10), newPoisson(8, 10)
	same, differ := true, false
	for range 100 {
		x, y, z := a.next(), b.next(), c.next()
		same = same && x == y
		differ = differ || x != z
	}
	if !same || !differ {
		t.Errorf("same seed same gaps: %v; other seed other gaps: %v", same, differ)
	}
	if g := newPoisson(1, 1e9).next(); g > time.Millisecond {
		t.Errorf("gap %v at 1e9/s", g)
	}
}
