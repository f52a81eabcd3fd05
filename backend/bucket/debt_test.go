package bucket

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// A gateway checks before it forwards (zero hits) and charges the tokens
// the response used when it ends. The charge lands whatever is left, the
// limit goes into debt, checks are denied until refill has repaid it, and
// the answers say when that is.
func TestChargeLandsBeyondWhatIsLeft(t *testing.T) {
	tpm := lim(t, "tpm", "40000/min", 60000) // 40,000 a minute: 1.5 ms a token
	limits := []Limit{tpm}
	st := []State{Full(tpm, 0)}
	res := make([]Result, 1)

	if !Decide(limits, st, 0, 0, res) {
		t.Fatal("a check on a full limit was denied")
	}
	if !Charge(limits, st, 50000, 0, res) || st[0].Tokens != 10000*Milli {
		t.Fatalf("a charge within what was left: allowed %v, %d millitokens left, want 10000000", res[0].Allowed, st[0].Tokens)
	}
	if Charge(limits, st, 50000, 0, res) {
		t.Fatal("a charge beyond what was left reported that the limit held it")
	}
	if st[0].Tokens != -40000*Milli || res[0].Tokens != -40000*Milli {
		t.Fatalf("after a charge of 50,000 on 10,000 left: %d millitokens, want -40000000", st[0].Tokens)
	}
	if st[0].Consumed != 100000*Milli {
		t.Fatalf("consumed %d millitokens, want every charge: 100000000", st[0].Consumed)
	}
	// 40,000 of debt at 40,000 a minute: a minute, and the first
	// millitoken after it (1.5 ms a token, 1.5 µs a millitoken, so the
	// refill step is 3 ms for 2 tokens).
	if want := Wait(tpm, st[0], 1, 0); res[0].Wait != want || want < Minute || want > Minute+3 {
		t.Fatalf("a charge into debt waits %d ms, want the time until above zero (%d, just over a minute)", res[0].Wait, want)
	}
	for _, hits := range []uint64{0, 1} {
		at := 30 * Second
		if Decide(limits, st, hits, at, res) {
			t.Fatalf("a request of %d hits was admitted while the limit was in debt", hits)
		}
		if st[0].Tokens != -20000*Milli {
			t.Fatalf("half the debt repaid after 30 s: %d millitokens, want -20000000", st[0].Tokens)
		}
		if res[0].Wait < 30*Second || res[0].Wait > 30*Second+3 {
			t.Fatalf("denied in debt, %d hits: wait %d ms, want just over 30 s", hits, res[0].Wait)
		}
	}
	// Repaid, the limit admits again, starting from zero.
	if !Decide(limits, st, 100, Minute+3*Second, res) {
		t.Fatal("a request was denied after refill repaid the debt")
	}
	if st[0].Tokens != 2000*Milli-100*Milli {
		t.Fatalf("3 s after repaying: %d millitokens, want 1900000", st[0].Tokens)
	}
}

// A plain request at an exhausted limit consumes nothing (a flood is
// never locked out beyond its rate); only a charge goes into debt.
func TestDeniedAdmissionsDoNotDig(t *testing.T) {
	rpm := lim(t, "rpm", "10/min", -1)
	limits := []Limit{rpm}
	st := []State{{Tokens: 0, Clock: 0}}
	res := make([]Result, 1)
	for range 1000 {
		if Decide(limits, st, 1, 0, res) {
			t.Fatal("an empty limit admitted a request")
		}
	}
	if st[0].Tokens != 0 || st[0].Consumed != 0 {
		t.Fatalf("a flood of denied requests left %d millitokens, %d consumed; want 0, 0", st[0].Tokens, st[0].Consumed)
	}
	if !Decide(limits, st, 1, 6*Second, res) {
		t.Fatal("the flood's limit did not admit its rate")
	}
}

// The floor: Debt zero is one burst, NoDebt keeps the limit at zero,
// and any other debt is that many millitokens. What the floor cuts off
// still counts as consumed, and nothing overflows, whatever the hits.
func TestChargeStopsAtTheFloor(t *testing.T) {
	base := lim(t, "tpm", "1000/min", 2000)
	for _, c := range []struct {
		name  string
		debt  int64
		floor int64
	}{
		{"default, one burst", 0, -2000 * Milli},
		{"no debt", NoDebt, 0},
		{"any negative is no debt", -7, 0},
		{"a debt of its own", 500 * Milli, -500 * Milli},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := base
			l.Debt = c.debt
			if Floor(l) != c.floor {
				t.Fatalf("Floor %d, want %d", Floor(l), c.floor)
			}
			for _, hits := range []uint64{5000, math.MaxUint64} {
				st := []State{Full(l, 0)}
				res := make([]Result, 1)
				Charge([]Limit{l}, st, hits, 0, res)
				if st[0].Tokens != c.floor {
					t.Fatalf("%d hits on a full limit: %d millitokens, want the floor %d", hits, st[0].Tokens, c.floor)
				}
				if st[0].Consumed != Cost(l, hits) {
					t.Fatalf("%d hits: consumed %d, want the whole cost %d", hits, st[0].Consumed, Cost(l, hits))
				}
				// A second charge at the floor stays there.
				Charge([]Limit{l}, st, hits, 0, res)
				if st[0].Tokens != c.floor || st[0].Consumed <= 0 {
					t.Fatalf("a second charge: %d millitokens (want %d), consumed %d", st[0].Tokens, c.floor, st[0].Consumed)
				}
			}
		})
	}
}

// A refund (is_negative_hits) and a lowered limit repay or carry debt:
// the refund adds to what is owed, a limit whose new floor is higher
// forgives what it does not allow.
func TestDebtUnderRefundsAndChangedLimits(t *testing.T) {
	l := lim(t, "tpm", "1000/min", 1000)
	st := []State{{Tokens: -800 * Milli, Clock: 0}}
	res := make([]Result, 1)
	Refund([]Limit{l}, st, 300, 0, res)
	if st[0].Tokens != -500*Milli {
		t.Fatalf("a refund of 300 on a debt of 800: %d millitokens, want -500000", st[0].Tokens)
	}
	lowered := l
	lowered.Debt = 200 * Milli
	next := Reconcile([]Limit{l}, st, []Limit{lowered}, 0)
	if next[0].Tokens != -200*Milli {
		t.Fatalf("a debt of 500 under a limit allowing 200: %d millitokens, want -200000", next[0].Tokens)
	}
	raised := l
	raised.Burst = 5000 * Milli
	next = Reconcile([]Limit{l}, st, []Limit{raised}, 0)
	if next[0].Tokens != -500*Milli {
		t.Fatalf("a raised burst kept a debt of %d millitokens, want -500000", -next[0].Tokens)
	}
}

// The fingerprint moves with a limit's debt, but a limit with the
// default debt keeps the fingerprint it had before limits had one, so
// that stored buckets are not rewritten by an upgrade.
func TestFingerprintOfDebt(t *testing.T) {
	l := lim(t, "tpm", "1000/min", 1000)
	const before = "18ieoac8iv1y7" // Fingerprint of l at 0572225, before Limit had Debt
	if got := Fingerprint([]Limit{l}); got != before {
		t.Fatalf("the default debt changed the fingerprint: %s, want %s", got, before)
	}
	none, other := l, l
	none.Debt, other.Debt = NoDebt, 10*Milli
	seen := map[string]bool{Fingerprint([]Limit{l}): true}
	for _, x := range []Limit{none, other} {
		f := Fingerprint([]Limit{x})
		if seen[f] {
			t.Fatalf("debt %d shares a fingerprint", x.Debt)
		}
		seen[f] = true
	}
	none.Debt = -5
	if Fingerprint([]Limit{none}) != Fingerprint([]Limit{{Name: "tpm", Amount: l.Amount, Period: l.Period, Burst: l.Burst, Debt: NoDebt}}) {
		t.Fatal("two ways of saying no debt have different fingerprints")
	}
}

// For any limits and any mix of admissions, checks, charges and refunds
// at any times: every state stays within [Floor, Burst]; nothing is
// admitted, not even a check, while a limit is at or below zero; and
// what admissions and charges took never exceeds the burst, the refill
// over the span and the deepest debt allowed, over every span of the
// run (one that starts after idle or mid-run as well as at the first
// call), with one refill step of slack for the refill pending at its
// start.
func TestPropertyDebtKeepsTheBound(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for iter := 0; iter < 400; iter++ {
		n := 1 + r.IntN(3)
		limits := make([]Limit, n)
		for i := range limits {
			limits[i] = randomLimit(r, string(rune('a'+i)))
			switch r.IntN(4) {
			case 0:
				limits[i].Debt = NoDebt
			case 1:
				limits[i].Debt = r.Int64N(1<<uint(r.IntN(30))+1) * Milli
			}
		}
		start := r.Int64N(1 << 40)
		st := make([]State, n)
		for i, l := range limits {
			st[i] = Full(l, start)
		}
		res := make([]Result, n)
		taken := make([]int64, n) // what landed in the tokens, less refunds
		// Per step, its time and what had been taken before it.
		type mark struct {
			at    int64
			taken []int64
		}
		var marks []mark
		now := start
		for step := 0; step < 300; step++ {
			now += r.Int64N(limits[0].Period/50 + 1)
			hits := uint64(r.IntN(5))
			if r.IntN(10) == 0 {
				hits = uint64(r.Int64N(limits[0].Burst/Milli*3 + 1))
			}
			if r.IntN(50) == 0 {
				hits = r.Uint64()
			}
			before := make([]State, n)
			for i, l := range limits {
				before[i] = Refill(l, st[i], now)
			}
			marks = append(marks, mark{now, slices.Clone(taken)})
			switch k := r.IntN(10); {
			case k == 0:
				Refund(limits, st, hits, now, res)
			case k < 4:
				Charge(limits, st, hits, now, res)
			default:
				if Decide(limits, st, hits, now, res) {
					for i := range limits {
						if before[i].Tokens <= 0 {
							t.Fatalf("limit %v admitted %d hits holding %d millitokens", limits[i], hits, before[i].Tokens)
						}
					}
				}
			}
			for i, l := range limits {
				s := st[i]
				taken[i] += before[i].Tokens - s.Tokens
				if s.Tokens < Floor(l) || s.Tokens > l.Burst {
					t.Fatalf("limit %v: %d millitokens, outside [%d, %d]", l, s.Tokens, Floor(l), l.Burst)
				}
				if s.Clock > now {
					t.Fatalf("limit %v: clock %d past now %d", l, s.Clock, now)
				}
			}
			// Every span that ends with this step: from the start of
			// any step up to now.
			for _, m := range marks {
				for i, l := range limits {
					_, step := quantum(l)
					if l.Amount == 0 {
						step = 0
					}
					bound := satAdd(satAdd(satAdd(l.Burst, mulDivSat(now-m.at, l.Amount, l.Period)), step), -Floor(l))
					if got := taken[i] - m.taken[i]; got > bound {
						t.Fatalf("limit %v: %d millitokens taken over the %d ms from %d, over burst + refill + debt %d", l, got, now-m.at, m.at, bound)
					}
				}
			}
		}
	}
}

// Tokens out on lease may still be spent, so the floor holds the bucket
// and its leases together: with 300 out, a charge takes the bucket to
// 300 below the floor, where bucket and leases stand at the floor.
func TestFloorCountsLeasesOut(t *testing.T) {
	l := lim(t, "tpm", "1000/min", 1000)
	st := []State{Full(l, 0)}
	st[0], _ = Lend(st[0], 7, 300*Milli, 0)
	if got := Bottom(l, st[0]); got != -1300*Milli {
		t.Fatalf("Bottom with 300 out of a floor of -1000: %d, want -1300000", got)
	}
	res := make([]Result, 1)
	Charge([]Limit{l}, st, 5000, 0, res)
	if st[0].Tokens != -1300*Milli || st[0].Tokens+st[0].Leased() != Floor(l) {
		t.Fatalf("a charge beyond the floor with 300 out: %d millitokens in the bucket, want -1300000", st[0].Tokens)
	}
}
