package bucket

import (
	"math"
	"math/rand/v2"
	"testing"
)

func lim(t *testing.T, name, rate string, burst int64) Limit {
	t.Helper()
	a, p, err := ParseRate(rate)
	if err != nil {
		t.Fatal(err)
	}
	b := a
	if burst >= 0 {
		b = burst * Milli
	}
	return Limit{Name: name, Amount: a, Period: p, Burst: b}
}

func TestParseRate(t *testing.T) {
	cases := []struct {
		in             string
		amount, period int64
		bad            bool
	}{
		{in: "100/min", amount: 100_000, period: Minute},
		{in: "5/10s", amount: 5000, period: 10 * Second},
		{in: "0/second", amount: 0, period: Second},
		{in: "1/DAY", amount: 1000, period: Day},
		{in: " 7 / 2h ", amount: 7000, period: 2 * Hour},
		{in: "3/month", amount: 3000, period: 30 * Day},
		{in: "3/year", amount: 3000, period: 365 * Day},
		{in: "3/w", amount: 3000, period: Week},
		{in: "100", bad: true},
		{in: "-1/s", bad: true},
		{in: "1.5/s", bad: true},
		{in: "1/0s", bad: true},
		{in: "1/fortnight", bad: true},
		{in: "1/11year", bad: true},
		{in: "1099511627777/s", bad: true},
	}
	for _, c := range cases {
		a, p, err := ParseRate(c.in)
		if c.bad {
			if err == nil {
				t.Errorf("ParseRate(%q) = %d, %d; want an error", c.in, a, p)
			}
			continue
		}
		if err != nil || a != c.amount || p != c.period {
			t.Errorf("ParseRate(%q) = %d, %d, %v; want %d, %d", c.in, a, p, err, c.amount, c.period)
		}
		if back := FormatRate(a, p); back != "" {
			a2, p2, err := ParseRate(back)
			if err != nil || a2 != a || p2 != p {
				t.Errorf("FormatRate(%q) = %q does not parse back", c.in, back)
			}
		}
	}
}

// Refilling in many small steps must credit exactly what one big step does.
// A floor on both the tokens and the clock over-credits non-integral rates
// (100/min refilled every millisecond would admit almost twice its rate).
func TestRefillIsExactWhateverTheStep(t *testing.T) {
	for _, rate := range []string{"100/min", "7/min", "1000/s", "997/s", "5/10s", "1/day", "1000003/year"} {
		l := lim(t, "x", rate, 1<<30)
		s := State{Tokens: 0, Clock: 0}
		one := Refill(l, s, 3*Hour)
		for now := int64(1); now <= 3*Hour; now += 1 + now%7 {
			s = Refill(l, s, now)
		}
		s = Refill(l, s, 3*Hour)
		if s.Tokens != one.Tokens {
			t.Errorf("%s: stepwise refill gave %d millitokens, one refill %d", rate, s.Tokens, one.Tokens)
		}
		want := 3 * Hour * l.Amount / l.Period
		if one.Tokens > want || want-one.Tokens > l.Amount/gcd(l.Amount, l.Period) {
			t.Errorf("%s: refill over 3h = %d millitokens, exact %d", rate, one.Tokens, want)
		}
		if s.Clock > 3*Hour {
			t.Errorf("%s: clock %d ran past now", rate, s.Clock)
		}
	}
}

// Pitfall 1: a bucket that sat full must not credit its idle time later.
func TestIdleFullBucketAdmitsOneBurst(t *testing.T) {
	l := lim(t, "x", "10/s", 20)
	st := []State{Full(l, 0)}
	res := make([]Result, 1)
	now := int64(0)
	Decide([]Limit{l}, st, 1, now, res) // consume on a full bucket
	now += Hour
	admitted := 0
	for Decide([]Limit{l}, st, 1, now, res) {
		admitted++
	}
	if admitted != 20 {
		t.Fatalf("after an idle hour a burst admitted %d, want the burst 20", admitted)
	}
}

// Pitfall 2: a slow limit beside a fast one still refills.
func TestSlowLimitBesideFastLimitRefills(t *testing.T) {
	fast := lim(t, "rps", "1000/s", -1)
	slow := lim(t, "rpd", "1000/day", -1)
	limits := []Limit{fast, slow}
	st := []State{Full(fast, 0), Full(slow, 0)}
	res := make([]Result, 2)
	admitted := 0
	// One request every 10 ms for two days.
	for now := int64(0); now <= 2*Day; now += 10 {
		if Decide(limits, st, 1, now, res) {
			admitted++
		}
	}
	want := 1000 + 2*1000 // burst + rate * 2 days
	if admitted != want {
		t.Fatalf("admitted %d over two days, want %d", admitted, want)
	}
}

func TestDecideAllOrNothing(t *testing.T) {
	rpm := lim(t, "rpm", "10/min", -1)
	tpm := lim(t, "tpm", "1000/min", -1)
	rpm.PerRequest = true
	limits := []Limit{rpm, tpm}
	st := []State{Full(rpm, 0), Full(tpm, 0)}
	res := make([]Result, 2)

	if !Decide(limits, st, 600, 0, res) {
		t.Fatal("600 tokens of 1000 denied")
	}
	if st[0].Tokens != 9*Milli || st[1].Tokens != 400*Milli {
		t.Fatalf("after one call: rpm %d tpm %d millitokens", st[0].Tokens, st[1].Tokens)
	}
	if Decide(limits, st, 600, 0, res) {
		t.Fatal("600 tokens with 400 left admitted")
	}
	if st[0].Tokens != 9*Milli || st[1].Tokens != 400*Milli {
		t.Fatal("a denied decision consumed tokens")
	}
	if res[0].Allowed != true || res[1].Allowed != false || Binding(limits, res) != 1 {
		t.Fatalf("binding limit: results %+v", res)
	}
	// 200 tokens in a minute: the deficit is refilled in 12 s.
	if res[1].Wait != 12*Second {
		t.Fatalf("wait %d ms, want 12000", res[1].Wait)
	}
	// Zero hits check without consuming, even on the per-request limit.
	if !Decide(limits, st, 0, 0, res) || st[0].Tokens != 9*Milli || st[1].Tokens != 400*Milli {
		t.Fatal("a zero-hit check consumed or was denied")
	}
}

func TestZeroRateDeniesEverythingThatCosts(t *testing.T) {
	l := lim(t, "block", "0/s", -1)
	st := []State{Full(l, 0)}
	res := make([]Result, 1)
	if Decide([]Limit{l}, st, 1, Year, res) {
		t.Fatal("zero rate admitted a hit")
	}
	if res[0].Wait != Never {
		t.Fatalf("zero rate wait %d, want Never", res[0].Wait)
	}
	// Holding nothing, it denies a check too: the request checked
	// would be denied (at or below zero a limit denies checks).
	if Decide([]Limit{l}, st, 0, Year, res) || res[0].Wait != Never {
		t.Fatalf("zero rate allowed a zero-cost check (wait %d)", res[0].Wait)
	}
	if TimeToFill(l) != 0 {
		t.Fatal("an empty burst is full at once")
	}
}

func TestAbsurdHitsNeverOverflow(t *testing.T) {
	l := lim(t, "x", "1099511627776/s", -1) // the largest rate
	st := []State{Full(l, 0)}
	res := make([]Result, 1)
	for _, hits := range []uint64{math.MaxUint64, math.MaxUint64 / 1000, uint64(MaxTokens) + 1, 1 << 63} {
		if Decide([]Limit{l}, st, hits, 0, res) {
			t.Fatalf("hits %d admitted past the burst", hits)
		}
		if res[0].Wait != Never || st[0].Tokens != l.Burst {
			t.Fatalf("hits %d: wait %d tokens %d", hits, res[0].Wait, st[0].Tokens)
		}
	}
	if !Decide([]Limit{l}, st, uint64(MaxTokens), math.MaxInt64, res) || st[0].Tokens != 0 {
		t.Fatal("the whole burst was not admitted")
	}
	Refund([]Limit{l}, st, math.MaxUint64, math.MaxInt64, res)
	if st[0].Tokens != l.Burst {
		t.Fatalf("refund left %d, want the burst", st[0].Tokens)
	}
}

// Pitfall 8: a refund never lifts a bucket above its burst.
func TestRefundCapsAtBurst(t *testing.T) {
	l := lim(t, "x", "10/s", -1)
	st := []State{{Tokens: 5 * Milli, Clock: 0}}
	res := make([]Result, 1)
	Refund([]Limit{l}, st, 3, 0, res)
	if st[0].Tokens != 8*Milli {
		t.Fatalf("refund of 3 on 5: %d", st[0].Tokens)
	}
	Refund([]Limit{l}, st, 100, 0, res)
	if st[0].Tokens != 10*Milli || res[0].Tokens != 10*Milli {
		t.Fatalf("refund past the burst: %d", st[0].Tokens)
	}
}

func TestBindingPrefersLeastFullThenLongestWait(t *testing.T) {
	a := Limit{Name: "a", Amount: 10 * Milli, Period: Second, Burst: 10 * Milli}
	b := Limit{Name: "b", Amount: 100 * Milli, Period: Minute, Burst: 100 * Milli}
	limits := []Limit{a, b}
	res := []Result{{Allowed: true, Tokens: 5 * Milli}, {Allowed: true, Tokens: 40 * Milli}}
	if got := Binding(limits, res); got != 1 {
		t.Fatalf("40%% full vs 50%% full: binding %d", got)
	}
	res = []Result{{Allowed: false, Wait: 100}, {Allowed: false, Wait: Never}}
	if got := Binding(limits, res); got != 1 {
		t.Fatalf("never vs 100 ms: binding %d", got)
	}
	res = []Result{{Allowed: false, Wait: 100}, {Allowed: true, Tokens: 0}}
	if got := Binding(limits, res); got != 0 {
		t.Fatalf("denied vs allowed: binding %d", got)
	}
	if Binding(nil, nil) != -1 {
		t.Fatal("empty bucket has no binding limit")
	}
}

// Pitfalls 3 and 4: changed limits reach an existing bucket.
func TestReconcile(t *testing.T) {
	old := []Limit{
		{Name: "keep", Amount: 10 * Milli, Period: Second, Burst: 10 * Milli},
		{Name: "lower", Amount: 100 * Milli, Period: Second, Burst: 100 * Milli},
		{Name: "gone", Amount: 1 * Milli, Period: Second, Burst: 1 * Milli},
	}
	st := []State{{Tokens: 2 * Milli, Clock: 500}, {Tokens: 90 * Milli, Clock: 1000}, {}}
	limits := []Limit{
		{Name: "lower", Amount: 50 * Milli, Period: Second, Burst: 50 * Milli},
		{Name: "new", Amount: 5 * Milli, Period: Second, Burst: 5 * Milli},
		{Name: "keep", Amount: 20 * Milli, Period: Second, Burst: 20 * Milli},
	}
	next := Reconcile(old, st, limits, 1000)
	if next[0] != (State{Tokens: 50 * Milli, Clock: 1000}) {
		t.Errorf("lowered limit: %+v, want capped at the new burst", next[0])
	}
	if next[1] != (State{Tokens: 5 * Milli, Clock: 1000}) {
		t.Errorf("added limit: %+v, want full", next[1])
	}
	// keep: 2 tokens + 0.5 s at the old 10/s = 7, under the new burst 20.
	if next[2] != (State{Tokens: 7 * Milli, Clock: 1000}) {
		t.Errorf("kept limit: %+v", next[2])
	}
	if Fingerprint(old) == Fingerprint(limits) {
		t.Error("different limits share a fingerprint")
	}
	if Fingerprint(limits) != Fingerprint([]Limit{limits[2], limits[0], limits[1]}) {
		t.Error("the fingerprint depends on the order of the limits")
	}
}

func TestTimeToFill(t *testing.T) {
	cases := []struct {
		l    Limit
		want int64
	}{
		{Limit{Amount: 10 * Milli, Period: Second, Burst: 10 * Milli}, Second},
		{Limit{Amount: 10 * Milli, Period: Second, Burst: 25 * Milli}, 2500},
		{Limit{Amount: 3 * Milli, Period: Second, Burst: 1 * Milli}, 334},
		{Limit{Amount: 0, Period: Second, Burst: 1 * Milli}, Never},
		{Limit{Amount: 1, Period: MaxPeriod, Burst: MaxTokens * Milli}, math.MaxInt64},
	}
	for _, c := range cases {
		if got := TimeToFill(c.l); got != c.want {
			t.Errorf("TimeToFill(%+v) = %d, want %d", c.l, got, c.want)
		}
	}
}

func TestParseLimit(t *testing.T) {
	cases := []struct {
		in   string
		want Limit
		bad  bool
	}{
		{in: "rpm=100/min", want: Limit{Name: "rpm", Amount: 100_000, Period: Minute, Burst: 100_000}},
		{in: "tpm=100000/min:burst=150000:cost=hits", want: Limit{Name: "tpm", Amount: 100_000_000, Period: Minute, Burst: 150_000_000}},
		{in: "r=20/min:cost=request", want: Limit{Name: "r", Amount: 20_000, Period: Minute, Burst: 20_000, PerRequest: true}},
		{in: "v1.chat=5/10s:burst=0", want: Limit{Name: "v1.chat", Amount: 5000, Period: 10 * Second, Burst: 0}},
		{in: "blocked=0/s", want: Limit{Name: "blocked", Amount: 0, Period: Second, Burst: 0}},
		{in: "tpm=40000/min:debt=0", want: Limit{Name: "tpm", Amount: 40_000_000, Period: Minute, Burst: 40_000_000, Debt: NoDebt}},
		{in: "tpm=40000/min:debt=20000", want: Limit{Name: "tpm", Amount: 40_000_000, Period: Minute, Burst: 40_000_000, Debt: 20_000_000}},
		{in: "tpm=40000/min:debt=-1", bad: true},
		{in: "tpm=40000/min:debt=1099511627777", bad: true},
		{in: "tpm=40000/min:debt=lots", bad: true},
		{in: "rpm", bad: true},
		{in: "=100/min", bad: true},
		{in: "rpm=", bad: true},
		{in: "rpm=100", bad: true},
		{in: "rpm=100/min:burst=x", bad: true},
		{in: "rpm=100/min:burst=-1", bad: true},
		{in: "rpm=100/min:burst=1:burst=2", bad: true},
		{in: "rpm=100/min:cost=tokens", bad: true},
		{in: "rpm=100/min:ttl=5", bad: true},
		{in: "rpm=100/min:", bad: true},
	}
	for _, c := range cases {
		got, err := ParseLimit(c.in)
		if c.bad {
			if err == nil {
				t.Errorf("ParseLimit(%q) = %+v; want an error", c.in, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ParseLimit(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
}

// Every limit the config syntax can express prints in the compact syntax
// and parses back to itself, so `sluice limits get` output can be pasted
// into `sluice limits set`.
func TestPropertyLimitStringRoundTrips(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	units := []int64{Second, Minute, Hour, Day, Week, Month, Year}
	for range 20_000 {
		l := Limit{
			Name:       []string{"rpm", "tpm", "a.b-c", "x_y"}[r.IntN(4)],
			Amount:     r.Int64N(1_000_000) * Milli,
			Period:     units[r.IntN(len(units))] * (1 + r.Int64N(9)),
			PerRequest: r.IntN(2) == 0,
		}
		l.Burst = l.Amount
		if r.IntN(2) == 0 {
			l.Burst = r.Int64N(2_000_000) * Milli
		}
		switch r.IntN(3) {
		case 0:
			l.Debt = NoDebt
		case 1:
			l.Debt = (1 + r.Int64N(2_000_000)) * Milli
		}
		back, err := ParseLimit(l.String())
		if err != nil || back != l {
			t.Fatalf("%+v prints as %q, which parses to %+v, %v", l, l.String(), back, err)
		}
	}
}
