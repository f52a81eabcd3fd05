package redis

import (
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend/backendtest"
	"github.com/sluice-rl/sluice/backend/redis/redistest"
)

// A budget beside a rate resets at midnight in Berlin, with its debt
// carried, on a real Redis (backendtest.BudgetsResetAtTheBoundary): the
// script compares clocks with the period starts the Go side computes,
// alone and with leases, which end before the boundary.
func TestBudgetsResetAtTheBoundary(t *testing.T) {
	srv := redistest.Require(t)
	for _, c := range []struct {
		name string
		opts Options
	}{
		{"without leases", Options{KeyPrefix: "budget-nolease", LeaseHorizon: -1}},
		{"with leases", Options{KeyPrefix: "budget-lease", LeaseHorizon: 30 * time.Second}},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := backendtest.NewClock(backendtest.BudgetStart)
			c.opts.Now = clock.Now
			client := newClient(t, srv)
			backendtest.BudgetsResetAtTheBoundary(t, newBackend(t, client, c.opts), clock, newAdmin(t, client, c.opts.KeyPrefix, clock.Now).GetBucket)
		})
	}
}
