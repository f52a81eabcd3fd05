package dynamodb

import (
	"testing"

	"github.com/sluice-rl/sluice/backend/backendtest"
)

// A budget beside a rate resets at midnight in Berlin, with its debt
// carried, on DynamoDB Local (backendtest.BudgetsResetAtTheBoundary): the
// first write of a new period rewrites the item, conditioned on it as it
// was, and the writes within a period are the incremental ones; without
// leases and with them, which end before the boundary.
func TestBudgetsResetAtTheBoundary(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct {
		name string
		opts Options
	}{
		{"without leases", Options{KeyPrefix: "budget-nolease", LeaseHorizon: -1}},
		{"with leases", Options{KeyPrefix: "budget-lease"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := backendtest.NewClock(backendtest.BudgetStart)
			c.opts.Now = clock.Now
			ad, err := NewAdmin(e.client, e.table, c.opts.KeyPrefix, clock.Now)
			if err != nil {
				t.Fatal(err)
			}
			backendtest.BudgetsResetAtTheBoundary(t, e.replica(t, c.opts), clock, ad.GetBucket)
		})
	}
}

// Three replicas with leases, and one without, spend a budget of 500 a
// day across two midnights in Berlin (backendtest.BudgetHoldsAcrossBoundaries):
// no day admits more than its budget (the replicas that cross a
// boundary together race for one rewrite), and leases of one day do
// not starve the next.
func TestBudgetHoldsAcrossBoundaries(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct {
		name     string
		replicas int
		opts     Options
	}{
		{"one replica without leases", 1, Options{KeyPrefix: "budget-days-nolease", LeaseHorizon: -1}},
		{"three replicas with leases", 3, Options{KeyPrefix: "budget-days-lease"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := backendtest.NewClock(0)
			c.opts.Now = clock.Now
			var ds []backendtest.Decider
			for range c.replicas {
				ds = append(ds, e.replica(t, c.opts))
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
