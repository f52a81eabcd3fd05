package memory

import (
	"testing"

	"github.com/sluice-rl/sluice/backend/backendtest"
)

func TestBudgetsResetAtTheBoundary(t *testing.T) {
	clock := backendtest.NewClock(backendtest.BudgetStart)
	b := New(Options{Now: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { b.Close() })
	backendtest.BudgetsResetAtTheBoundary(t, b, clock, nil)
}

func TestBudgetHoldsAcrossBoundaries(t *testing.T) {
	clock := backendtest.NewClock(0)
	b := New(Options{Now: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { b.Close() })
	days := backendtest.BudgetHoldsAcrossBoundaries(t, []backendtest.Decider{b}, clock)
	if len(days) != 3 || days[0] != 60 || days[1] != 500 || days[2] != 500 {
		t.Fatalf("days admitted %v, want 60 (all asked) then 500 a day", days)
	}
}
