package bucket

import (
	"math"
	"math/bits"
	"math/rand/v2"
	"testing"
)

// mulDivSat is a*b/c, saturating at a quarter of MaxInt64 so the sum with
// a burst cannot overflow either.
func mulDivSat(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64 / 4
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(min(q, math.MaxInt64/4))
}

// randomLimit draws a limit across the whole range of shapes: tiny and
// huge rates, long and short periods, bursts above and below the rate.
func randomLimit(r *rand.Rand, name string) Limit {
	periods := []int64{Second, 10 * Second, Minute, Hour, Day, Week, Month, Year}
	p := periods[r.IntN(len(periods))]
	amount := int64(r.IntN(5)) * Milli
	if r.IntN(4) > 0 {
		amount = (1 + r.Int64N(1<<uint(r.IntN(30)))) * Milli
	}
	burst := amount
	if r.IntN(2) == 0 {
		burst = r.Int64N(1<<uint(r.IntN(30))+1) * Milli
	}
	return Limit{Name: name, Amount: amount, Period: p, Burst: burst, PerRequest: r.IntN(5) == 0}
}

// For any limits and any sequence of calls, what a bucket admits never
// exceeds its burst plus what its rate refilled over the elapsed time, and
// every state stays within [0, burst] with its clock not past now.
func TestPropertyAdmittedWithinBurstPlusRate(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 400; iter++ {
		n := 1 + r.IntN(3)
		limits := make([]Limit, n)
		for i := range limits {
			limits[i] = randomLimit(r, string(rune('a'+i)))
		}
		start := r.Int64N(1 << 40)
		st := make([]State, n)
		for i, l := range limits {
			st[i] = Full(l, start)
		}
		res := make([]Result, n)
		consumed := make([]int64, n)
		now := start
		for step := 0; step < 300; step++ {
			now += r.Int64N(limits[0].Period/50 + 1)
			hits := uint64(r.IntN(5))
			if r.IntN(50) == 0 {
				hits = r.Uint64()
			}
			before := append([]State(nil), st...)
			if r.IntN(20) == 0 {
				Refund(limits, st, hits, now, res)
				for i := range limits {
					consumed[i] -= st[i].Tokens - Refill(limits[i], before[i], now).Tokens
				}
			} else if Decide(limits, st, hits, now, res) {
				for i := range limits {
					consumed[i] += res[i].Cost
				}
			} else {
				for i, l := range limits {
					if st[i].Tokens != Refill(l, before[i], now).Tokens {
						t.Fatalf("a denied decision consumed tokens")
					}
				}
			}
			for i, l := range limits {
				s := st[i]
				if s.Tokens < 0 || s.Tokens > l.Burst || s.Clock > now {
					t.Fatalf("limit %+v: state %+v out of bounds at %d", l, s, now)
				}
				bound := l.Burst + mulDivSat(now-start, l.Amount, l.Period)
				if consumed[i] > bound {
					t.Fatalf("limit %+v: consumed %d millitokens in %d ms, bound %d", l, consumed[i], now-start, bound)
				}
			}
		}
	}
}

// A denied request is admitted once its reported wait has passed, and not
// a millisecond earlier (when nothing else touches the bucket).
func TestPropertyWaitIsExact(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	checked := 0
	for iter := 0; iter < 3000; iter++ {
		l := randomLimit(r, "x")
		l.PerRequest = false
		now := r.Int64N(1 << 40)
		s := State{Tokens: r.Int64N(l.Burst + 1), Clock: now - r.Int64N(l.Period)}
		hits := uint64(1 + r.IntN(int(l.Burst/Milli)+2))
		st := []State{s}
		res := make([]Result, 1)
		if Decide([]Limit{l}, st, hits, now, res) {
			continue
		}
		w := res[0].Wait
		if w == Never {
			if Cost(l, hits) <= l.Burst && l.Amount > 0 {
				t.Fatalf("%+v hits %d: Never, but the cost fits the burst", l, hits)
			}
			continue
		}
		checked++
		early := []State{st[0]}
		if Decide([]Limit{l}, early, hits, now+w-1, res) {
			t.Fatalf("%+v from %+v: admitted at wait-1 (%d ms)", l, s, w)
		}
		late := []State{st[0]}
		if !Decide([]Limit{l}, late, hits, now+w, res) {
			t.Fatalf("%+v from %+v: denied after the wait (%d ms)", l, s, w)
		}
	}
	if checked < 500 {
		t.Fatalf("only %d denied cases exercised", checked)
	}
}

// Any state that holds Burst-k tokens or more and whose clock is
// FillTime(k) or more before now refills to its burst by now; one
// millisecond less, and a state holding exactly Burst-k does not.
func TestPropertyFillTimeMeansFull(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for iter := 0; iter < 20000; iter++ {
		l := randomLimit(r, "x")
		if l.Amount == 0 || l.Burst == 0 {
			continue
		}
		k := r.Int64N(l.Burst + 1)
		fill := FillTime(l, k)
		if fill > 1<<40 {
			continue
		}
		now := int64(1<<41) + r.Int64N(1<<40)
		s := State{Tokens: l.Burst - k + r.Int64N(k+1), Clock: now - fill - r.Int64N(1+fill)}
		if got := Refill(l, s, now); got.Tokens != l.Burst {
			t.Fatalf("%+v k %d fill %d: %+v refills to %+v at %d, not full", l, k, fill, s, got, now)
		}
		if k > 0 && fill > 0 {
			edge := State{Tokens: l.Burst - k, Clock: now - fill + 1}
			if got := Refill(l, edge, now); got.Tokens == l.Burst {
				t.Fatalf("%+v k %d: full %d ms early, so FillTime %d is not the least", l, k, 1, fill)
			}
		}
	}
}

// Claiming the least refill that pays a cost, and leaving the rest on the
// clock, is the same state as refilling in full and paying, once both are
// refilled: nothing is lost or credited twice.
func TestPropertyClaimIsExact(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	checked := 0
	for iter := 0; iter < 20000; iter++ {
		l := randomLimit(r, "x")
		l.PerRequest = false
		if l.Amount == 0 || l.Burst == 0 {
			continue
		}
		now := int64(1<<41) + r.Int64N(1<<40)
		s := State{Tokens: r.Int64N(l.Burst + 1), Clock: now - r.Int64N(2*l.Period)}
		full := Refill(l, s, now)
		cost := r.Int64N(full.Tokens + 1)
		if full.Tokens >= l.Burst {
			continue // a full limit's clock moves to now instead
		}
		ms, tokens := Claim(l, s, cost)
		if ms > now-s.Clock || s.Tokens+tokens < cost {
			t.Fatalf("%+v from %+v cost %d: claimed %d ms, %d tokens: beyond the refill or short of the cost", l, s, cost, ms, tokens)
		}
		claimed := State{Tokens: s.Tokens + tokens - cost, Clock: s.Clock + ms}
		want := full
		want.Tokens -= cost
		if got := Refill(l, claimed, now); got.Tokens != want.Tokens || got.Clock != want.Clock {
			t.Fatalf("%+v from %+v cost %d: claim then refill %+v, refill then pay %+v", l, s, cost, got, want)
		}
		checked++
	}
	if checked < 5000 {
		t.Fatalf("only %d cases checked", checked)
	}
}

// Cost never overflows and always denies what cannot fit, for any hits.
func TestPropertyCostBounded(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for i := 0; i < 100000; i++ {
		l := randomLimit(r, "x")
		hits := r.Uint64() >> uint(r.IntN(64))
		c := Cost(l, hits)
		if c < 0 || c > (MaxTokens+1)*Milli {
			t.Fatalf("Cost(%d) = %d", hits, c)
		}
		if !l.PerRequest && hits > 0 && hits <= uint64(MaxTokens) && c != int64(hits)*Milli {
			t.Fatalf("Cost(%d) = %d", hits, c)
		}
	}
}
