package backend

import (
	"sync/atomic"
	"time"
)

// RoundTrip is a moving average of how long a write to the store takes,
// in microseconds: what times lease renewals, and tells which calls
// cannot wait for the store before their deadline. The zero value has
// seen nothing. It is safe for concurrent use.
type RoundTrip struct{ us atomic.Int64 }

// Observe adds a write that took d. The backend leaves out the writes
// whose time says nothing of the distance (those that failed for any
// reason but a lost race).
func (r *RoundTrip) Observe(d time.Duration) {
	sample := max(d.Microseconds(), 1)
	for {
		old := r.us.Load()
		next := sample
		if old > 0 {
			next = old + (sample-old)/8
		}
		if r.us.CompareAndSwap(old, next) {
			return
		}
	}
}

// Ms is the average in whole milliseconds, rounded, and at least 1 once
// a write has been seen: 0 only before the first.
func (r *RoundTrip) Ms() int64 {
	us := r.us.Load()
	if us == 0 {
		return 0
	}
	return max((us+500)/1000, 1)
}
