package rlqs

import (
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/bucket/period"
)

// An assignment on a bucket with a budget ends by the budget's boundary
// less the writers' margin, so that what a period paid for is spent in
// it; a second at the least, Envoy's shortest TTL; a rate alone leaves
// the TTL as it is.
func TestAssignmentsEndByTheBudgetsBoundary(t *testing.T) {
	berlin, err := period.LoadZone("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	p := Policy{}.withDefaults() // TTL 10 s, allowance 250 ms
	rate := bucket.Limit{Name: "rpm", Amount: 60_000, Period: bucket.Minute, Burst: 60_000}
	day := bucket.Limit{Name: "tpd", Amount: 1000_000, Period: bucket.Day, Burst: 1000_000, Calendar: period.Day, Zone: berlin}
	midnight := time.Date(2026, 10, 25, 0, 0, 0, 0, berlin).UnixMilli()
	c, _ := capacityOf([]bucket.Limit{rate, day})
	r, _ := capacityOf([]bucket.Limit{rate})
	for _, x := range []struct {
		before int64 // ms before midnight
		cap    capacity
		want   time.Duration
	}{
		{3600_000, c, 10 * time.Second},
		{12_250, c, 10 * time.Second},
		{12_249, c, 9 * time.Second},
		{5_000, c, 2 * time.Second},
		{3_000, c, time.Second},
		{100, c, time.Second},
		{100, r, 10 * time.Second},
	} {
		now := midnight - x.before
		got := p.ttlBefore(p.TTL, x.cap, now)
		if got != x.want {
			t.Errorf("%d ms before midnight: TTL %v, want %v", x.before, got, x.want)
		}
		if x.cap.budgets != nil && x.want > time.Second && now+(got+p.Allowance).Milliseconds() > midnight-bucket.ExpiryMargin {
			t.Errorf("%d ms before midnight: an assignment of %v outlives the period", x.before, got)
		}
	}
}
