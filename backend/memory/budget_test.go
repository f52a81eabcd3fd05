package memory

import (
	"strings"
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

// The overrides file takes a budget's period and zone as the rule files
// do, and refuses a zone that does not exist.
func TestOverridesBudget(t *testing.T) {
	o, err := ParseOverrides([]byte("resources:\n  chat:\n    limits:\n      - {name: month, rate: 1000, period: month, zone: Europe/Berlin}\n"))
	if err != nil {
		t.Fatal(err)
	}
	r, ok, _ := o.Resource(t.Context(), "chat")
	if !ok || len(r.Limits) != 1 || !r.Limits[0].IsBudget() || r.Limits[0].ZoneName() != "Europe/Berlin" {
		t.Fatalf("overrides: %+v", r)
	}
	if _, err := ParseOverrides([]byte("system:\n  limits: [{name: d, rate: 10, period: day, zone: Mars/Olympus}]\n")); err == nil || !strings.Contains(err.Error(), `"Mars/Olympus" does not exist`) {
		t.Fatalf("a zone that does not exist: %v", err)
	}
}
