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

// Three replicas with leases, and one without, spend a budget of 500 a
// day across two midnights in Berlin (backendtest.BudgetHoldsAcrossBoundaries):
// no day admits more than its budget, and leases of one day do not
// starve the next.
func TestBudgetHoldsAcrossBoundaries(t *testing.T) {
	srv := redistest.Require(t)
	for _, c := range []struct {
		name     string
		replicas int
		opts     Options
	}{
		{"one replica without leases", 1, Options{KeyPrefix: "budget-days-nolease", LeaseHorizon: -1}},
		{"three replicas with leases", 3, Options{KeyPrefix: "budget-days-lease", LeaseHorizon: 30 * time.Second}},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := backendtest.NewClock(0)
			c.opts.Now = clock.Now
			var ds []backendtest.Decider
			for range c.replicas {
				ds = append(ds, newBackend(t, newClient(t, srv), c.opts))
			}
			days := backendtest.BudgetHoldsAcrossBoundaries(t, ds, clock)
			t.Logf("admitted per day: %v", days)
			for i, n := range days[1:] {
				if n < 400 {
					t.Errorf("day %d admitted %d of 500 under a demand of about 5,000", i, n)
				}
			}
		})
	}
}
