package backendtest

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/bucket/period"
)

// Clock is a settable clock for a backend's Now option, in epoch ms.
type Clock struct{ ms atomic.Int64 }

// NewClock is a clock standing at ms.
func NewClock(ms int64) *Clock {
	c := &Clock{}
	c.ms.Store(ms)
	return c
}

// Now reads the clock.
func (c *Clock) Now() int64 { return c.ms.Load() }

// Set moves the clock to ms.
func (c *Clock) Set(ms int64) { c.ms.Store(ms) }

// BudgetStart is where BudgetsResetAtTheBoundary's clock starts: 23:00 in
// Berlin on 2026-10-24, an hour before a day of 25 hours (daylight
// saving ends on the 25th).
var BudgetStart = time.Date(2026, 10, 24, 23, 0, 0, 0, mustZone("Europe/Berlin")).UnixMilli()

func mustZone(name string) *time.Location {
	loc, err := period.LoadZone(name)
	if err != nil {
		panic(err)
	}
	return loc
}

// BudgetLimits are the limits BudgetsResetAtTheBoundary decides on: 20
// requests a minute beside a budget of 1,000 tokens a calendar day in
// Europe/Berlin, in one bucket.
func BudgetLimits() []bucket.Limit {
	return []bucket.Limit{
		{Name: "rpm", Amount: 20 * bucket.Milli, Period: bucket.Minute, Burst: 20 * bucket.Milli, PerRequest: true},
		{Name: "tpd", Amount: 1000 * bucket.Milli, Period: bucket.Day, Burst: 1000 * bucket.Milli,
			Calendar: period.Day, Zone: mustZone("Europe/Berlin")},
	}
}

// BudgetsResetAtTheBoundary holds a backend to what a budget promises,
// on BudgetLimits with the backend's clock at clock (its Now option),
// starting at BudgetStart: within the day the budget does not refill
// while the rate beside it does; a charge after the response takes it
// into debt; the answers wait until midnight in Berlin, exactly; at
// midnight the new day is given the budget less the debt carried, and
// waits the 25 hours of that day; a day later the budget is full again.
// stored, when not nil, reads the bucket as its store keeps it: it must
// hold the budget, its calendar and its state.
func BudgetsResetAtTheBoundary(t *testing.T, d Decider, clock *Clock, stored func(ctx context.Context, entity, resource string) (backend.Bucket, bool, error)) {
	t.Helper()
	limits := BudgetLimits()
	call := func(what string, hits uint64, charge bool) backend.Decision {
		t.Helper()
		dec, err := d.Decide(context.Background(), &backend.Request{Entity: "tenant", Resource: "chat",
			Defaults: limits, Hits: hits, Charge: charge})
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if len(dec.Results) != 2 {
			t.Fatalf("%s: %d results, want 2", what, len(dec.Results))
		}
		return dec
	}
	left := func(what string, dec backend.Decision, want int64) {
		t.Helper()
		if got := dec.Results[1].Tokens; got != want*bucket.Milli {
			t.Fatalf("%s: the budget holds %d millitokens, want %d", what, got, want*bucket.Milli)
		}
	}
	midnight := time.Date(2026, 10, 25, 0, 0, 0, 0, mustZone("Europe/Berlin")).UnixMilli()
	waits := func(what string, dec backend.Decision, until int64) {
		t.Helper()
		if got, want := dec.Results[1].Wait, until-clock.Now(); got != want {
			t.Fatalf("%s: the budget waits %d ms, want %d", what, got, want)
		}
	}
	clock.Set(BudgetStart)
	dec := call("a check", 0, false)
	if !dec.Allowed {
		t.Fatal("a check on a new bucket was denied")
	}
	left("a check", dec, 1000)
	dec = call("a charge of 900", 900, true)
	left("a charge of 900", dec, 100)
	waits("a charge of 900", dec, midnight)
	// Fifty minutes on, the rate has refilled; the budget has not.
	clock.Set(BudgetStart + 50*bucket.Minute)
	dec = call("an admission of 200", 200, false)
	if dec.Allowed {
		t.Fatal("200 admitted with 100 left of the day's budget")
	}
	left("an admission of 200 denied", dec, 100)
	waits("an admission of 200 denied", dec, midnight)
	if dec.Binding != 1 {
		t.Fatalf("binding limit %d, want the budget", dec.Binding)
	}
	dec = call("a charge of 300", 300, true)
	left("a charge of 300 (into debt)", dec, -200)
	if dec = call("a check in debt", 0, false); dec.Allowed {
		t.Fatal("a check was admitted on a budget in debt")
	}
	waits("a check in debt", dec, midnight)
	// A millisecond before midnight nothing has changed.
	clock.Set(midnight - 1)
	if dec = call("a check at 23:59:59.999", 0, false); dec.Allowed {
		t.Fatal("the budget was given before midnight")
	}
	waits("a check at 23:59:59.999", dec, midnight)
	// Midnight: a new day, its budget less the debt, until the next
	// midnight 25 hours on.
	clock.Set(midnight)
	next := midnight + 25*bucket.Hour
	dec = call("a check at midnight", 0, false)
	if !dec.Allowed {
		t.Fatal("a check at midnight was denied")
	}
	left("a check at midnight", dec, 800)
	waits("a check at midnight", dec, next)
	dec = call("an admission of 800", 800, false)
	if !dec.Allowed {
		t.Fatal("800 denied with 800 left")
	}
	left("an admission of 800", dec, 0)
	if dec = call("an admission of 1", 1, false); dec.Allowed {
		t.Fatal("an admission beyond the day's budget was allowed")
	}
	waits("an admission of 1 denied", dec, next)
	if stored != nil {
		b, ok, err := stored(context.Background(), "tenant", "chat")
		if err != nil || !ok {
			t.Fatalf("reading the bucket: %v, %v", ok, err)
		}
		for i, l := range b.Limits {
			if l.Name == "tpd" {
				// Consumed counts what left the bucket, leases
				// granted included.
				if s := b.States[i]; s.Tokens != 0 || s.Consumed < 2000*bucket.Milli || !l.IsBudget() || l.ZoneName() != "Europe/Berlin" {
					t.Fatalf("the store holds %+v: %d millitokens, %d consumed; want a budget in Europe/Berlin at 0, at least 2000000 consumed", l, s.Tokens, s.Consumed)
				}
			}
		}
	}
	// Two days on, the budget is full.
	clock.Set(next + 30*bucket.Hour)
	dec = call("a check two days on", 0, false)
	left("a check two days on", dec, 1000)
	if !dec.Allowed || dec.Results[1].Wait != 0 {
		t.Fatalf("a full budget: allowed %v, wait %d", dec.Allowed, dec.Results[1].Wait)
	}
}

// BudgetPhases are the instants BudgetHoldsAcrossBoundaries decides at,
// in Berlin: the last seconds of 2026-10-24, the first of the 25th (a
// day of 25 hours), its noon and its last seconds, and the 26th.
func BudgetPhases() []int64 {
	berlin := mustZone("Europe/Berlin")
	return []int64{
		time.Date(2026, 10, 24, 23, 59, 55, 0, berlin).UnixMilli(),
		time.Date(2026, 10, 25, 0, 0, 1, 0, berlin).UnixMilli(),
		time.Date(2026, 10, 25, 12, 0, 0, 0, berlin).UnixMilli(),
		time.Date(2026, 10, 25, 23, 59, 59, 0, berlin).UnixMilli(),
		time.Date(2026, 10, 26, 0, 0, 0, 0, berlin).UnixMilli(),
	}
}

// BudgetHoldsAcrossBoundaries has ds (replicas of one store, or one
// backend) admit requests of 1 to 5 tokens, four callers each, against
// a budget of 500 tokens a day in Berlin, at each of BudgetPhases in
// turn (the clock stands still within a phase, so that each call's day
// is known; a few calls in the first, so that leases hold some of its
// budget when it ends, 150 per caller in the others): what is admitted in each calendar day is at most its
// budget, whatever the leases held when the day ended, and a new day is
// not starved by the old one's leases. It returns what each day admitted.
func BudgetHoldsAcrossBoundaries(t *testing.T, ds []Decider, clock *Clock) []int64 {
	t.Helper()
	l := bucket.Limit{Name: "tpd", Amount: 500 * bucket.Milli, Period: bucket.Day, Burst: 500 * bucket.Milli,
		Calendar: period.Day, Zone: mustZone("Europe/Berlin")}
	var days []int64
	var lastDay int64
	// Few calls in the last seconds of the first day, so that leases
	// hold tokens of it when it ends; then more than a day's budget.
	calls := []int{5, 150, 150, 150, 150}
	for i, at := range BudgetPhases() {
		clock.Set(at)
		day := bucket.Periods(l, at).Index
		if i == 0 || day != lastDay {
			days = append(days, 0)
			lastDay = day
		}
		var admitted atomic.Int64
		done := make(chan struct{})
		workers := 0
		for k, d := range ds {
			for w := range 4 {
				workers++
				go func() {
					defer func() { done <- struct{}{} }()
					for n := range calls[i] {
						hits := uint64(1 + (k+w+n)%5)
						dec, err := d.Decide(context.Background(), &backend.Request{Entity: "tenant", Resource: "budget",
							Defaults: []bucket.Limit{l}, Hits: hits})
						if err != nil {
							t.Errorf("phase %d: %v", i, err)
							return
						}
						if dec.Allowed {
							admitted.Add(int64(hits))
						}
					}
				}()
			}
		}
		for range workers {
			<-done
		}
		days[len(days)-1] += admitted.Load()
	}
	for i, n := range days {
		if n > 500 {
			t.Errorf("day %d admitted %d tokens of a budget of 500", i, n)
		}
	}
	return days
}
