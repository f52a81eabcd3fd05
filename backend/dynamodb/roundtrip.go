package dynamodb

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// roundTrip is a moving average of how long a bucket write takes, in
// microseconds (0: none seen yet). Writes that failed for any reason but
// a lost race say nothing of the distance and are left out.
type roundTrip struct{ us atomic.Int64 }

func (r *roundTrip) observe(d time.Duration, err error) {
	var ccf *types.ConditionalCheckFailedException
	var tce *types.TransactionCanceledException
	if err != nil && !errors.As(err, &ccf) && !errors.As(err, &tce) {
		return
	}
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

// ms is the average in whole milliseconds, rounded, and at least 1 once
// a write has been seen: 0 only before the first.
func (r *roundTrip) ms() int64 {
	us := r.us.Load()
	if us == 0 {
		return 0
	}
	return max((us+500)/1000, 1)
}
