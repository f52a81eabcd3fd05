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
// A write under a quarter of the average restarts it from that write, as
// the first write starts it: the store is near again, after a slow spell
// or a stall that put a slow write in. Coming down an eighth per write,
// the average of a table that answered in 2 s would need some thirty
// writes to reach one that answers in 10 ms, and meanwhile the replica,
// finding every call beyond reach (a round trip longer than the time to
// its deadline), makes few writes to learn from (in a test of exactly
// that, one replica's average was still 336 ms at the end of the run,
// seconds after the table came back, and it failed half its calls on
// the key at its limit). An
// average that rises an eighth per write and drops at once errs towards
// waiting for the store: a call that waits for a write that cannot come
// back in time is answered at its deadline, by the same policy.
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
