package bench

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestHistogramBuckets(t *testing.T) {
	prev := -1
	for _, v := range []uint64{0, 1, 127, 128, 129, 255, 256, 1000, 1 << 20, 1<<40 + 12345, math.MaxUint64} {
		i := histIndex(v)
		if i < prev || i >= histBuckets {
			t.Fatalf("index of %d is %d (previous %d, buckets %d)", v, i, prev, histBuckets)
		}
		prev = i
		mid := histMid(i)
		if diff := math.Abs(float64(mid) - float64(v)); diff > float64(v)/subCount {
			t.Errorf("value %d: bucket %d middle %d, off by more than 1/%d", v, i, mid, subCount)
		}
	}
}

func TestHistogramQuantiles(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var h histogram
	vals := make([]time.Duration, 100_000)
	for i := range vals {
		vals[i] = time.Duration(rng.ExpFloat64() * float64(100*time.Microsecond))
		h.record(vals[i])
	}
	slices.Sort(vals)
	for _, q := range []float64{0.5, 0.99, 0.999} {
		want := vals[int(math.Ceil(q*float64(len(vals))))-1]
		got := h.quantile(q)
		if math.Abs(float64(got-want)) > float64(want)/subCount+1 {
			t.Errorf("q%v = %v, want %v within 1/%d", q, got, want, subCount)
		}
	}
	var empty histogram
	if empty.quantile(0.5) != 0 {
		t.Error("quantile of an empty histogram is not 0")
	}
}
