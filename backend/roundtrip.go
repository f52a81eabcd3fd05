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
//
// The average moves an eighth of the way per write, but a write under a
// quarter of it restarts it from that write, as the first write does:
// the store is near again after a slow spell or one stalled write.
// Coming down an eighth per write, a replica that saw 2 s answers would
// need some thirty fast writes to believe the store near, and while it
// finds every call beyond reach it makes few writes to learn from
// (TestTableSlowThenGoneThenBack caught one replica still at 336 ms
// seconds after the table came back). Dropping at once errs towards
// waiting for the store, which is safe: a call that waits for a write
// that cannot come back in time is still answered at its deadline.
func (r *RoundTrip) Observe(d time.Duration) {
	sample := max(d.Microseconds(), 1)
	for {
		old := r.us.Load()
		next := sample
		if old > 0 && 4*sample >= old {
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
