package dynamodb

import (
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend/backendtest"
)

// The bound holds over a span that starts after the bucket's first calls
// (backendtest.SpanAfterIdle): the leases those calls took count against
// the burst in the item (ot, rm). Three replicas 5 ms from the table.
func TestSpanAfterIdleHoldsTheBound(t *testing.T) {
	e := newEnv(t)
	now := func() int64 { return time.Now().UnixMilli() }
	var ds []backendtest.Decider
	for range 3 {
		ds = append(ds, e.replica(t, Options{Now: now}, slowWrites{e.client, 5 * time.Millisecond}))
	}
	backendtest.SpanAfterIdle(t, ds, lim(t, "x", "20/s", 20))
}
