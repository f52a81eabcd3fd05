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
