package regions

import (
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/backend/bucket"
)

func TestNewSplit(t *testing.T) {
	for _, c := range []struct {
		name    string
		weights map[Region]int64
		want    map[Region]int64
	}{
		{"one region holds it all", map[Region]int64{"eu": 7}, map[Region]int64{"eu": Total}},
		{"equal weights, the rounding's part to the first name",
			map[Region]int64{"us": 1, "eu": 1, "ap": 1}, map[Region]int64{"ap": 333334, "eu": 333333, "us": 333333}},
		{"by weight", map[Region]int64{"us": 5, "eu": 3, "ap": 2}, map[Region]int64{"us": 500000, "eu": 300000, "ap": 200000}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := NewSplit(c.weights)
			if err != nil {
				t.Fatal(err)
			}
			var sum int64
			for r, want := range c.want {
				if got := s.Base(r); got != want {
					t.Errorf("base of %s: %d, want %d", r, got, want)
				}
				sum += s.Base(r)
			}
			if sum != Total || len(s.Regions()) != len(c.want) {
				t.Errorf("bases sum to %d over %v, want %d over %d regions", sum, s.Regions(), Total, len(c.want))
			}
		})
	}
	for name, w := range map[string]map[Region]int64{
		"no region":     {},
		"a zero weight": {"eu": 0, "us": 1},
		"a nameless":    {"": 1},
		"a long name":   {Region(strings.Repeat("r", 65)): 1},
		"too heavy":     {"eu": Total, "us": 1},
	} {
		if _, err := NewSplit(w); err == nil {
			t.Errorf("%s: NewSplit(%v) took it", name, w)
		}
	}
}

// TestScale checks that shares summing to the limit's parts never scale
// to more than the limit: each rounds down.
func TestScale(t *testing.T) {
	l := bucket.Limit{Name: "rps", Amount: 1000 * bucket.Milli, Period: 1000, Burst: 1000 * bucket.Milli}
	if got := Scale(l, Total/4); got.Amount != 250*bucket.Milli || got.Burst != 250*bucket.Milli || got.Name != "rps" || got.Period != 1000 {
		t.Errorf("a quarter: %+v", got)
	}
	if got := Scale(l, -5); got.Amount != 0 || got.Burst != 0 {
		t.Errorf("below zero: %+v, want nothing", got)
	}
	if got := Scale(l, 2*Total); got != l {
		t.Errorf("past Total: %+v, want the whole limit", got)
	}
	odd := bucket.Limit{Name: "odd", Amount: 7, Period: 3, Burst: 11}
	var amount, burst int64
	for _, p := range []int64{333334, 333333, 333333} {
		amount += Scale(odd, p).Amount
		burst += Scale(odd, p).Burst
	}
	if amount > odd.Amount || burst > odd.Burst {
		t.Errorf("thirds of %+v scale to %d and %d together", odd, amount, burst)
	}
	// A charge's debt floor is split as the burst is: the regions
	// together go no further below zero than the limit allows.
	debt := bucket.Limit{Name: "tpm", Amount: 40_000 * bucket.Milli, Period: 60_000, Burst: 60_000 * bucket.Milli, Debt: 100_000 * bucket.Milli}
	var floor int64
	for _, p := range []int64{Total / 2, Total * 3 / 10, Total / 5} {
		floor += Scale(debt, p).Debt
	}
	if floor != debt.Debt {
		t.Errorf("the parts' debt floors add up to %d, want the limit's %d", floor, debt.Debt)
	}
	for _, d := range []int64{0, bucket.NoDebt} {
		l := debt
		l.Debt = d
		if got := Scale(l, Total/4).Debt; got != d {
			t.Errorf("debt %d scaled to %d, want it kept (one burst, none)", d, got)
		}
	}
	tiny := debt
	tiny.Debt = 3
	if got := Scale(tiny, Total/1000); got.Debt != 1 || got.Validate() != nil {
		t.Errorf("a debt of 3 millitokens at a thousandth: %+v (%v), want 1, not 0 (one burst)", got, got.Validate())
	}
	huge := bucket.Limit{Name: "huge", Amount: 1 << 62, Period: 1, Burst: 1 << 62}
	if got := Scale(huge, Total/2); got.Amount != 1<<61 {
		t.Errorf("half of 2^62: %d, want 2^61 (no overflow)", got.Amount)
	}
}

func TestClock(t *testing.T) {
	c := Clock{Window: 10_000, Skew: 1_000, Hold: 2_000}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := c.CacheFor(); got != 4_500 {
		t.Errorf("CacheFor %d ms, want 4500", got)
	}
	for _, x := range []struct {
		ms   int64
		want Slot
	}{{0, 0}, {9_999, 0}, {10_000, 1}, {-1, -1}, {-10_000, -1}, {-10_001, -2}} {
		if got := c.At(x.ms); got != x.want {
			t.Errorf("At(%d) = %d, want %d", x.ms, got, x.want)
		}
	}
	// A loan written up to a quarter into slot 4 may start in slot 5;
	// after that, in slot 6.
	if got := c.FirstLoanSlot(42_500); got != 5 {
		t.Errorf("FirstLoanSlot at the deadline: %d, want 5", got)
	}
	if got := c.FirstLoanSlot(42_501); got != 6 {
		t.Errorf("FirstLoanSlot just past the deadline: %d, want 6", got)
	}
	for _, bad := range []Clock{{}, {Window: 10_000, Skew: -1}, {Window: 10_000, Hold: -1}, {Window: 4_000, Skew: 1_000, Hold: 2_000}} {
		if bad.Validate() == nil {
			t.Errorf("%+v validated", bad)
		}
	}
}
