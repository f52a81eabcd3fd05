package bench

import (
	"math"
	"math/bits"
	"time"
)

// The latency histogram is log-linear, in the manner of HdrHistogram:
// values below 2*subCount nanoseconds are exact, and every power of two
// above is cut into subCount buckets, so a quantile is off by at most
// 1/subCount (1.6%). Recording is an index computation and an increment,
// with no allocation and no sharing (each worker has its own), so that
// measuring does not dominate what is measured; a run of any length needs
// the same fixed memory.
const (
	subBits  = 6
	subCount = 1 << subBits
	// The largest shift is 63-subBits, so indexes stay below this.
	histBuckets = (64 - subBits + 1) * subCount
)

type histogram struct {
	counts [histBuckets]uint64
	total  uint64
	max    uint64
}

func histIndex(v uint64) int {
	if v < 2*subCount {
		return int(v)
	}
	shift := bits.Len64(v) - subBits - 1
	return shift*subCount + int(v>>shift)
}

// histMid is the middle of the values bucket i holds.
func histMid(i int) uint64 {
	if i < 2*subCount {
		return uint64(i)
	}
	shift := i/subCount - 1
	m := uint64(i - shift*subCount)
	return m<<shift + (uint64(1)<<shift)/2
}

func (h *histogram) record(d time.Duration) {
	v := uint64(max(d, 0))
	h.counts[histIndex(v)]++
	h.total++
	h.max = max(h.max, v)
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.total += o.total
	h.max = max(h.max, o.max)
}

// quantile returns the q-quantile (0 < q <= 1) of the recorded values,
// never more than the largest; 0 when nothing was recorded.
func (h *histogram) quantile(q float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.total)))
	rank = min(max(rank, 1), h.total)
	var seen uint64
	for i, c := range h.counts {
		if seen += c; seen >= rank {
			return time.Duration(min(histMid(i), h.max))
		}
	}
	return time.Duration(h.max)
}
