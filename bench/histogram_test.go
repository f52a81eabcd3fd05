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

func TestWorkloadPick(t *testing.T) {
	rs, err := Workload{Domain: "d", Entries: []Entry{{"a", "x"}, {"b", "v"}}, Dist: Hot, Keys: 5, HotFraction: 0.8}.build()
	if err != nil {
		t.Fatal(err)
	}
	if got := rs.reqs[3].Descriptors[0].Entries[1].Value; got != "v-3" {
		t.Fatalf("key 3 value %q, want v-3", got)
	}
	if got := rs.reqs[3].Descriptors[0].Entries[0].Value; got != "x" {
		t.Fatalf("first entry value %q, want x unchanged", got)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	hot := 0
	for range 10_000 {
		if rs.pick(rng) == rs.reqs[0] {
			hot++
		}
	}
	if hot < 7_500 || hot > 8_500 {
		t.Fatalf("hot key drawn %d times in 10000, want about 8000", hot)
	}

	fixed, err := Workload{Domain: "d", Entries: []Entry{{"a", "x"}}, Dist: Fixed, Keys: 5}.build()
	if err != nil {
		t.Fatal(err)
	}
	if len(fixed.reqs) != 1 || fixed.reqs[0].Descriptors[0].Entries[0].Value != "x" {
		t.Fatalf("fixed workload built %d requests", len(fixed.reqs))
	}
}

func TestParse(t *testing.T) {
	for _, s := range []string{"fixed", "Uniform", "HOT"} {
		if _, err := ParseDistribution(s); err != nil {
			t.Error(err)
		}
	}
	if _, err := ParseDistribution("zipf"); err == nil {
		t.Error("zipf accepted")
	}
	if e, err := ParseEntry("k=a=b"); err != nil || e != (Entry{"k", "a=b"}) {
		t.Errorf("ParseEntry(k=a=b) = %v, %v", e, err)
	}
	for _, s := range []string{"novalue", "=v"} {
		if _, err := ParseEntry(s); err == nil {
			t.Errorf("ParseEntry(%q) accepted", s)
		}
	}
}
