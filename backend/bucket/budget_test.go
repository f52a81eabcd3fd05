package bucket

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/backend/bucket/period"
)

func budget(t *testing.T, s string) Limit {
	t.Helper()
	l, err := ParseLimit(s)
	if err != nil {
		t.Fatal(err)
	}
	if !l.IsBudget() {
		t.Fatalf("%q is not a budget", s)
	}
	return l
}

func berlinMs(t *testing.T, s string) int64 {
	t.Helper()
	loc, err := period.LoadZone("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	tm, err := time.ParseInLocation("2006-01-02 15:04:05", s, loc)
	if err != nil {
		t.Fatal(err)
	}
	return tm.UnixMilli()
}

func TestParseBudget(t *testing.T) {
	for _, c := range []struct {
		in    string
		unit  period.Unit
		zone  string
		milli int64
	}{
		{"tokens=10000000:period=month:zone=Europe/Berlin", period.Month, "Europe/Berlin", 10_000_000 * Milli},
		{"tokens=10000000/month:zone=Europe/Berlin", period.Month, "Europe/Berlin", 10_000_000 * Milli},
		{"t=5/months:period=month", period.Month, "UTC", 5 * Milli},
		{"d=100:period=day", period.Day, "UTC", 100 * Milli},
		{"w=100:period=week:zone=America/New_York:cost=request:debt=0", period.Week, "America/New_York", 100 * Milli},
		{"y=1/year:zone=UTC", period.Year, "UTC", Milli},
	} {
		l := budget(t, c.in)
		if l.Calendar != c.unit || l.ZoneName() != c.zone || l.Amount != c.milli || l.Burst != c.milli {
			t.Errorf("%q: %+v", c.in, l)
		}
		back, err := ParseLimit(l.String())
		if err != nil || back.Calendar != l.Calendar || back.ZoneName() != l.ZoneName() || back.Amount != l.Amount ||
			back.Debt != l.Debt || back.PerRequest != l.PerRequest || back.Period != l.Period {
			t.Errorf("%q prints as %q, which parses to %+v, %v", c.in, l.String(), back, err)
		}
	}
	for _, bad := range []string{
		"t=10:period=month:zone=Europe/Atlantis", // no such zone
		"t=10:period=fortnight",                  // no such period
		"t=10:period=hour",                       // a rate's unit, not a period's
		"t=10/day:period=month",                  // the rate's unit is not the period
		"t=10/2month:period=month",               // a budget is for one period
		"t=10/min:zone=Europe/Berlin",            // a zone for a rate
		"t=10:zone=Europe/Berlin",                // a zone and no period
		"t=10/month:zone=Local",                  // the machine's zone
		"t=10:period=month:burst=20",             // a budget holds its amount
		"t=10:period=month:debt=11",              // more debt than a period repays
		"t=10:period=month:period=day",
	} {
		if l, err := ParseLimit(bad); err == nil {
			t.Errorf("ParseLimit(%q) = %+v; want an error", bad, l)
		}
	}
	if l, err := ParseLimit("t=10/month"); err != nil || l.IsBudget() {
		t.Errorf("10/month without a period or zone is a rate over 30 days: %+v, %v", l, err)
	}
}

// A budget does not refill within its period, is given in full at the
// boundary (midnight on the first of the month in Berlin, whatever the
// month's length or a daylight-saving change), and says so in its wait.
func TestBudgetResetsAtTheBoundary(t *testing.T) {
	tpmo := budget(t, "tokens=1000:period=month:zone=Europe/Berlin")
	limits := []Limit{tpmo}
	res := make([]Result, 1)
	// Set on the 31st: its first period is the rest of January, in full.
	start := berlinMs(t, "2026-01-31 23:00:00")
	st := []State{Full(tpmo, start)}
	if !Decide(limits, st, 600, start, res) || st[0].Tokens != 400*Milli {
		t.Fatalf("600 of 1000: %v, %d", res[0].Allowed, st[0].Tokens)
	}
	if want := berlinMs(t, "2026-02-01 00:00:00") - start; res[0].Wait != want {
		t.Fatalf("wait %d ms, want the hour to the boundary (%d)", res[0].Wait, want)
	}
	late := berlinMs(t, "2026-01-31 23:59:59") + 999
	if Decide(limits, st, 401, late, res) || st[0].Tokens != 400*Milli {
		t.Fatalf("a budget refilled within its period: %d", st[0].Tokens)
	}
	if res[0].Wait != 1 {
		t.Fatalf("a millisecond before the boundary, wait %d", res[0].Wait)
	}
	feb := late + 1
	if !Decide(limits, st, 1000, feb, res) {
		t.Fatalf("the first instant of February is not given the budget: %d", st[0].Tokens)
	}
	// February 2026 has 28 days; March 29 loses an hour, so March ends
	// at 22:00 UTC on the 31st.
	if want := berlinMs(t, "2026-03-01 00:00:00") - feb; res[0].Wait != want || want != 28*Day {
		t.Fatalf("February waits %d ms, want %d (28 days)", res[0].Wait, want)
	}
	mar := berlinMs(t, "2026-03-01 00:00:00")
	Decide(limits, st, 1, mar, res)
	if want := berlinMs(t, "2026-04-01 00:00:00") - mar; res[0].Wait != want || want != 31*Day-Hour {
		t.Fatalf("March waits %d ms, want %d (31 days less an hour)", res[0].Wait, want)
	}
}

// Debt is carried: a charge that overshoots at the end of a period
// leaves the next one its budget less the overshoot, and one more
// period repays what is left of it.
func TestBudgetCarriesDebt(t *testing.T) {
	b := budget(t, "tokens=1000:period=day:zone=Europe/Berlin")
	limits := []Limit{b}
	res := make([]Result, 1)
	d1 := berlinMs(t, "2026-10-24 12:00:00")
	st := []State{Full(b, d1)}
	if !Decide(limits, st, 0, d1, res) {
		t.Fatal("a check on a full budget was denied")
	}
	Charge(limits, st, 1300, d1, res) // 300 beyond
	if st[0].Tokens != -300*Milli {
		t.Fatalf("after the overshoot %d", st[0].Tokens)
	}
	if Decide(limits, st, 0, d1+Hour, res) {
		t.Fatal("a check on a budget in debt was admitted")
	}
	// The 25th is 25 hours long in Berlin.
	d2 := berlinMs(t, "2026-10-25 00:00:00")
	if res[0].Wait != d2-d1-Hour {
		t.Fatalf("debt waits %d, want the boundary %d", res[0].Wait, d2-d1-Hour)
	}
	st[0] = Refill(b, st[0], d2)
	if st[0].Tokens != 700*Milli {
		t.Fatalf("the new day starts at %d, want the budget less the debt (700000)", st[0].Tokens)
	}
	Decide(limits, st, 700, d2, res)
	if want := berlinMs(t, "2026-10-26 00:00:00") - d2; res[0].Wait != want || want != 25*Hour {
		t.Fatalf("the 25th waits %d, want 25 hours", res[0].Wait)
	}
	// Deep debt: a whole budget. The next day repays it, the day after
	// gives the budget; idle across both, the budget is full.
	Charge(limits, st, 5000, d2, res)
	if st[0].Tokens != -1000*Milli {
		t.Fatalf("the floor is one budget: %d", st[0].Tokens)
	}
	if Decide(limits, st, 1, d2, res) || res[0].Wait != berlinMs(t, "2026-10-27 00:00:00")-d2 {
		t.Fatalf("a budget's worth of debt waits %d, want two boundaries", res[0].Wait)
	}
	if s := Refill(b, st[0], berlinMs(t, "2026-10-26 08:00:00")); s.Tokens != 0 {
		t.Fatalf("a day repays a budget of debt: %d", s.Tokens)
	}
	if s := Refill(b, st[0], berlinMs(t, "2026-10-27 08:00:00")); s.Tokens != 1000*Milli {
		t.Fatalf("two days: %d", s.Tokens)
	}
}

// A budget beside rates in one bucket: 20 rpm, 60,000 tpm and 10 million
// tokens a calendar month. The rates refill, the budget does not, and
// the budget binds once it is spent.
func TestBudgetBesideRates(t *testing.T) {
	rpm := lim(t, "rpm", "20/min", -1)
	rpm.PerRequest = true
	tpm := lim(t, "tpm", "60000/min", -1)
	mo := budget(t, "month=100000:period=month:zone=Europe/Berlin")
	limits := []Limit{rpm, tpm, mo}
	now := berlinMs(t, "2026-06-30 12:00:00")
	st := []State{Full(rpm, now), Full(tpm, now), Full(mo, now)}
	res := make([]Result, 3)
	admitted := int64(0)
	for i := range 200 {
		if Decide(limits, st, 50000, now+int64(i)*Minute, res) {
			admitted++
		}
	}
	if admitted != 2 {
		t.Fatalf("admitted %d requests of 50,000 against 100,000 a month, want 2", admitted)
	}
	if i := Binding(limits, res); i != 2 {
		t.Fatalf("binding %s, want the month", limits[i].Name)
	}
	if want := berlinMs(t, "2026-07-01 00:00:00") - (now + 199*Minute); res[2].Wait != want {
		t.Fatalf("the month waits %d, want %d", res[2].Wait, want)
	}
	if !Decide(limits, st, 50000, berlinMs(t, "2026-07-01 00:00:00"), res) {
		t.Fatal("July is not given its budget")
	}
}

// Changing a budget keeps what was used of the period; forgives only
// debt the new one does not allow.
func TestReconcileBudget(t *testing.T) {
	now := berlinMs(t, "2026-05-10 10:00:00")
	b10 := budget(t, "t=10000:period=month:zone=Europe/Berlin")
	b5 := budget(t, "t=5000:period=month:zone=Europe/Berlin")
	b20 := budget(t, "t=20000:period=month:zone=Europe/Berlin")
	s := Full(b10, now)
	s.Tokens -= 3000 * Milli
	if got := Reconcile([]Limit{b10}, []State{s}, []Limit{b5}, now)[0]; got.Tokens != 2000*Milli {
		t.Errorf("10,000 lowered to 5,000 with 3,000 used leaves %d", got.Tokens)
	}
	if got := Reconcile([]Limit{b10}, []State{s}, []Limit{b20}, now)[0]; got.Tokens != 17000*Milli {
		t.Errorf("raised to 20,000 leaves %d", got.Tokens)
	}
	s.Tokens = -4000 * Milli // in debt
	if got := Reconcile([]Limit{b10}, []State{s}, []Limit{b5}, now)[0]; got.Tokens != -5000*Milli {
		t.Errorf("in debt, lowered: %d, want the new floor -5000000", got.Tokens)
	}
	// A rate that becomes a budget starts the budget's period now, and
	// a budget that becomes a rate refills from now.
	rate := lim(t, "t", "10000/month", -1)
	old := State{Tokens: 1000 * Milli, Clock: now - 20*Day}
	if got := Reconcile([]Limit{b10}, []State{old}, []Limit{rate}, now)[0]; got.Clock != now {
		t.Errorf("a budget turned rate keeps clock %d, want now", got.Clock)
	}
	got := Reconcile([]Limit{rate}, []State{{Tokens: 0, Clock: now}}, []Limit{b10}, now)[0]
	if got = Refill(b10, got, now+Hour); got.Tokens != 0 {
		t.Errorf("a rate turned budget was given its budget at once: %d", got.Tokens)
	}
}

// Over random decisions, charges and refunds on a budget beside a rate,
// across months of Berlin time (both daylight-saving changes, February):
// tokens stay within [floor, budget]; nothing is given within a period;
// a new period gives at most one budget, never lifts above it, and
// carries the debt; and what is taken over a run of periods is at most
// the budgets given plus one overshoot, net of refunds.
func TestPropertyBudgetBound(t *testing.T) {
	r := rand.New(rand.NewPCG(37, 44))
	for run := range 200 {
		unit := []string{"day", "week", "month"}[run%3]
		b := budget(t, "b=5000:period="+unit+":zone=Europe/Berlin")
		if run%4 == 0 {
			b.Debt = NoDebt
		}
		rate := lim(t, "r", "100/s", -1)
		limits := []Limit{rate, b}
		now := berlinMs(t, "2026-01-20 00:00:00") + r.Int64N(Day)
		st := []State{Full(rate, now), Full(b, now)}
		res := make([]Result, 2)
		var taken int64
		first := Periods(b, now).Index
		periods := int64(1)
		for range 3000 {
			now += r.Int64N(6 * Hour)
			p := Periods(b, now)
			before := st[1]
			if p.Index != Periods(b, before.Clock).Index {
				periods++
				want := min(before.Tokens+b.Amount, b.Burst)
				if Periods(b, before.Clock).Index < p.Index-1 {
					want = b.Burst
				}
				if got := Refill(b, before, now); got.Tokens != want || got.Clock != now {
					t.Fatalf("run %d: a new period from %d gives %d, want %d", run, before.Tokens, got.Tokens, want)
				}
			} else if got := Refill(b, before, now); got.Tokens != before.Tokens {
				t.Fatalf("run %d: refilled within the period: %d to %d", run, before.Tokens, got.Tokens)
			}
			hits := uint64(r.Int64N(1500))
			switch r.IntN(10) {
			case 0, 1, 2:
				Charge(limits, st, hits, now, res)
			case 3:
				Refund(limits, st, hits/4, now, res)
			default:
				Decide(limits, st, hits, now, res)
			}
			refilled := Refill(b, before, now)
			taken += refilled.Tokens - st[1].Tokens // net of refunds
			if st[1].Tokens < Floor(b) || st[1].Tokens > b.Burst {
				t.Fatalf("run %d: %d outside [%d, %d]", run, st[1].Tokens, Floor(b), b.Burst)
			}
			if Periods(b, st[1].Clock).Index != p.Index {
				t.Fatalf("run %d: the state left its period", run)
			}
			if limit := (p.Index-first+1)*b.Amount - Floor(b); taken > limit+int64(hits)*Milli {
				t.Fatalf("run %d: %d taken over %d periods, more than %d", run, taken, p.Index-first+1, limit)
			}
		}
		if periods < 3 {
			t.Fatalf("run %d crossed %d periods", run, periods)
		}
	}
}

// Leases of a budget end before its boundary, by the writers' margin.
func TestLeaseEndBeforeTheBoundary(t *testing.T) {
	b := budget(t, "t=10:period=day:zone=Europe/Berlin")
	now := berlinMs(t, "2026-03-29 12:00:00")
	if got, want := LeaseEnd(b, now), berlinMs(t, "2026-03-30 00:00:00")-ExpiryMargin; got != want {
		t.Fatalf("lease end %d, want %d", got, want)
	}
	if LeaseEnd(lim(t, "r", "1/s", -1), now) < now+Year {
		t.Fatal("a rate's leases are bounded by a calendar")
	}
	// What leases held in the old period is gone in the new one: it
	// starts with the whole budget as room.
	s := Full(b, now)
	s, _ = Lend(s, 1, 4*Milli, 0)
	s = Refill(b, s, berlinMs(t, "2026-03-30 00:00:00"))
	if s.Leased() != 0 || s.Tokens != 10*Milli {
		t.Fatalf("new period with old leases: %d out, %d held", s.Leased(), s.Tokens)
	}
	if _, ok := Return(b, s, Report{Window: 1, Out: 4 * Milli, Back: 4 * Milli}, now+Day); ok {
		t.Fatal("a report on an old period's lease was taken")
	}
}

// A budget set on February 29th is a calendar budget like any other: a
// month budget's first period is the rest of that day, in full, and it
// resets on March 1st (not on the 29th of each month); a charge that
// overshoots on the 29th is carried into March; a year budget set then
// resets on January 1st.
func TestBudgetSetOnFebruary29th(t *testing.T) {
	month := budget(t, "tokens=1000:period=month:zone=Europe/Berlin")
	year := budget(t, "tokens=1000:period=year:zone=Europe/Berlin")
	res := make([]Result, 1)
	leap := berlinMs(t, "2028-02-29 12:00:00")

	st := []State{Full(month, leap)}
	if !Decide([]Limit{month}, st, 600, leap, res) || st[0].Tokens != 400*Milli {
		t.Fatalf("600 of a month's 1000 on February 29th: %v, %d left", res[0].Allowed, st[0].Tokens)
	}
	if res[0].Wait != 12*Hour {
		t.Fatalf("on February 29th at noon the month resets in %d ms, want 12 h", res[0].Wait)
	}
	Charge([]Limit{month}, st, 700, leap+Hour, res) // the response used 700: 300 below zero
	if st[0].Tokens != -300*Milli {
		t.Fatalf("a charge of 700 with 400 left leaves %d, want -300 tokens", st[0].Tokens)
	}
	mar := berlinMs(t, "2028-03-01 00:00:00")
	if Decide([]Limit{month}, st, 701, mar, res) || !Decide([]Limit{month}, st, 700, mar, res) {
		t.Fatalf("March 1st after 300 of debt: 700 must pass and 701 not, %d left", st[0].Tokens)
	}
	// March 2028 loses an hour on the 26th.
	if want := berlinMs(t, "2028-04-01 00:00:00") - mar; res[0].Wait != want || want != 31*Day-Hour {
		t.Fatalf("March waits %d ms, want %d (31 days less an hour)", res[0].Wait, want)
	}

	st = []State{Full(year, leap)}
	Decide([]Limit{year}, st, 1, leap, res)
	if want := berlinMs(t, "2029-01-01 00:00:00") - leap; res[0].Wait != want {
		t.Fatalf("a year budget set on February 29th resets in %d ms, want %d (January 1st)", res[0].Wait, want)
	}
}
