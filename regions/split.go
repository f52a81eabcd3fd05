package regions

import (
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"slices"

	"github.com/sluice-rl/sluice/backend/bucket"
)

// Region names a region, as its sync and replicas are configured with
// (an AWS region such as "eu-west-1", or any name the operator picks).
type Region string

// Total is how many parts a global limit is cut into. A share of p parts
// is p/Total of the limit's rate and of its burst.
const Total = 1_000_000

// Split is how a global limit's parts are based over its regions: each
// region's base, which it enforces when it holds no loans and lends from
// when its demand is below it. Build one with NewSplit; the zero Split
// has no regions.
type Split struct {
	base map[Region]int64
}

// NewSplit bases Total over the regions in proportion to their weights
// (positive integers; equal weights split evenly). What rounding leaves
// over goes to the regions in name order, a part each, so that the bases
// sum to exactly Total and every region that reads the same weights
// computes the same bases.
func NewSplit(weights map[Region]int64) (Split, error) {
	if len(weights) == 0 {
		return Split{}, errors.New("regions: a global limit needs at least one region")
	}
	var sum int64
	for r, w := range weights {
		if r == "" || len(r) > maxRegionName {
			return Split{}, fmt.Errorf("regions: region %q: a name of 1 to %d bytes", r, maxRegionName)
		}
		if w <= 0 {
			return Split{}, fmt.Errorf("regions: region %q: weight %d is not positive", r, w)
		}
		if sum += w; sum > Total {
			return Split{}, fmt.Errorf("regions: weights sum to more than %d", Total)
		}
	}
	names := slices.Sorted(maps.Keys(weights))
	base := make(map[Region]int64, len(weights))
	var given int64
	for _, r := range names {
		base[r] = weights[r] * Total / sum
		given += base[r]
	}
	for i := 0; given < Total; i++ {
		base[names[i%len(names)]]++
		given++
	}
	return Split{base: base}, nil
}

// Base is r's base in parts; 0 for a region not in the split.
func (s Split) Base(r Region) int64 { return s.base[r] }

// Regions lists the split's regions in name order.
func (s Split) Regions() []Region { return slices.Sorted(maps.Keys(s.base)) }

// Has reports whether r is one of the split's regions.
func (s Split) Has(r Region) bool {
	_, ok := s.base[r]
	return ok
}

// Scale is the part of l that parts stands for: its rate (Amount per
// Period), its Burst and an explicit Debt floor, each times
// parts/Total, rounded down, so that shares summing to at most Total
// never scale to more than l, its debt included. A Debt of one burst
// (0) or none (NoDebt) stays so. Name, Period, PerRequest and a
// budget's calendar are l's.
func Scale(l bucket.Limit, parts int64) bucket.Limit {
	parts = min(max(parts, 0), Total)
	l.Amount = mulDiv(l.Amount, parts, Total)
	l.Burst = mulDiv(l.Burst, parts, Total)
	if l.Debt > 0 {
		// Rounded down to 0 it would read as one burst, which may be
		// more than l's own part of the floor: a millitoken, unless the
		// part has no burst either.
		l.Debt = max(mulDiv(l.Debt, parts, Total), min(l.Burst, 1))
	}
	return l
}

// mulDivUp is a*b/c rounded up, under the same terms as mulDiv.
func mulDivUp(a, b, c int64) int64 {
	q := mulDiv(a, b, c)
	if a > 0 {
		hi, lo := bits.Mul64(uint64(a), uint64(b))
		if _, rem := bits.Div64(hi, lo, uint64(c)); rem != 0 {
			q++
		}
	}
	return q
}

// mulDiv is a*b/c rounded down, without overflow, for 0 <= b <= c and
// c > 0; a negative a counts as 0 (a valid limit has none).
func mulDiv(a, b, c int64) int64 {
	if a <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	// hi < c because a*b <= a*c < c*2^64: the quotient fits.
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(q)
}
