package redis

import (
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend/backendtest"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
)

// The bound holds over a span that starts after the bucket's first calls
// (backendtest.SpanAfterIdle): the leases those calls took count against
// the burst in the limit's _ol field. Three replicas 5 ms from Redis.
func TestSpanAfterIdleHoldsTheBound(t *testing.T) {
	srv := redistest.Require(t)
	l := specLimits(t, []bucket.Spec{{Name: "x", Rate: "20/s", Burst: ptr(int64(20))}})[0]
	var ds []backendtest.Decider
	for range 3 {
		ds = append(ds, newBackend(t, newClient(t, srv), Options{LeaseHorizon: 30 * time.Second, Call: farCall(5 * time.Millisecond)}))
	}
	backendtest.SpanAfterIdle(t, ds, l)
}
