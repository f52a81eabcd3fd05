package bucket

import (
	"math"
	"math/bits"
)

// State is the stored state of one limit of a bucket.
//
// The zero State is an empty bucket whose clock stands at the epoch; use
// Full for a bucket that has never been seen.
type State struct {
	// Tokens held, in millitokens: Bottom <= Tokens <= Burst after any
	// function of this package has touched the state. Below zero only
	// after a charge of tokens already used (Charge): the limit is in
	// debt, and refill repays it first.
	Tokens int64
	// Clock is the time (epoch milliseconds) up to which refill has been
	// credited. It only moves by the time that was actually turned into
	// tokens, so no fraction of a token is lost between calls, and it is
	// never later than the now it was computed at.
	Clock int64
	// Consumed counts the millitokens ever consumed (refill never touches
	// it). It saturates instead of overflowing.
	Consumed int64
	// Out is what leases hold of this limit across the fleet, by the
	// window they expire in (outstanding.go): tokens that have left the
	// bucket and may still be spent. They count against the burst, so
	// refill stops at Burst less their sum (Room): the bucket and its
	// leases together never hold more than the burst, and a span that
	// starts while leases are out admits no more than one that starts
	// with them in the bucket. The zero value is no lease out.
	Out [LeaseSlots]Out
	// AtRoomSince is the time (epoch ms) since which the bucket has held
	// its Room, and refill has stood still, without a break; 0 when it is
	// below its room or that time is not known. Tokens spent from a lease
	// are counted out until their holder reports them, so the refill that
	// stood still meanwhile is owed to the room they made: a report may
	// credit it, once (Return).
	AtRoomSince int64
}

// Leased is the sum of what s's leases hold, in millitokens.
func (s State) Leased() int64 {
	var sum int64
	for _, o := range s.Out {
		sum += o.Tokens
	}
	return sum
}

// Room is the most tokens s may hold: l's burst less what its leases
// hold, never below zero. Refill and refunds stop there.
func Room(l Limit, s State) int64 {
	return max(l.Burst-s.Leased(), 0)
}

// Bottom is the fewest tokens s may hold: l's Floor less what its leases
// hold. A bucket and its leases together never go below the floor, as
// they never hold more than the burst (Room): tokens out on lease may
// still be spent, so a bucket at the floor with leases out would admit
// on them and have its next charges forgiven.
func Bottom(l Limit, s State) int64 {
	return Floor(l) - s.Leased()
}

// Full is the state of a bucket seen for the first time at now.
func Full(l Limit, now int64) State {
	return State{Tokens: l.Burst, Clock: now}
}

// quantum returns the smallest step of time (ms) that refills a whole
// number of millitokens, and that number. Refilling in these steps is exact:
// the clock advances by precisely the time the credited tokens stand for.
// Rates are whole tokens per whole seconds, so a step is at most 1/1000 of
// the period.
func quantum(l Limit) (dt, da int64) {
	g := gcd(l.Amount, l.Period)
	return l.Period / g, l.Amount / g
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// Refill credits the tokens that accrued between s.Clock and now. A bucket
// that reaches its Room (the burst less what its leases hold) is full,
// and a full bucket's clock moves to now: time spent full is never
// credited later (the back-dating pitfall), not even once leases come
// back and make room, except to a report of spent lease tokens, from
// AtRoomSince (Return).
func Refill(l Limit, s State, now int64) State {
	if l.IsBudget() {
		return refillBudget(l, s, now)
	}
	room := Room(l, s)
	if s.Tokens >= room {
		// A clock another writer moved past now stays: moving it back
		// would credit that time again once leases come back and make
		// room.
		s.Tokens, s.Clock = room, max(s.Clock, now)
		if s.AtRoomSince == 0 {
			// Since when is not known: from now, which owes nothing.
			s.AtRoomSince = s.Clock
		}
		return s
	}
	s.AtRoomSince = 0
	if s.Clock > now {
		// Another writer's clock ran ahead of ours; credit nothing rather
		// than move the clock backwards.
		return s
	}
	if l.Amount == 0 {
		return s
	}
	dt, da := quantum(l)
	steps := (now - s.Clock) / dt
	need := ceilDiv(room-s.Tokens, da)
	if steps >= need {
		s.Tokens, s.Clock, s.AtRoomSince = room, now, s.Clock+need*dt
		return s
	}
	s.Tokens += steps * da
	s.Clock += steps * dt
	return s
}

// Cost is what a request of hits costs limit l, in millitokens. Zero hits
// cost nothing (a check). A PerRequest limit costs one token for any
// positive hits. Hits beyond any possible burst are clamped to one token
// more than the largest burst, so the product cannot overflow and the
// request is still denied.
func Cost(l Limit, hits uint64) int64 {
	switch {
	case hits == 0:
		return 0
	case l.PerRequest:
		return Milli
	case hits > uint64(MaxTokens):
		return (MaxTokens + 1) * Milli
	}
	return int64(hits) * Milli
}

// RefundAmount is what a refund of hits gives back to l. Per-request limits
// count requests, and a refund does not undo the request, so it gives
// nothing back to them.
func RefundAmount(l Limit, hits uint64) int64 {
	if l.PerRequest {
		return 0
	}
	return Cost(l, hits)
}

// Never is the wait reported when no amount of waiting will do: the cost
// exceeds the burst, or the limit never refills.
const Never = int64(-1)

// Wait is how long (ms) after now until s holds at least need millitokens,
// for a state already refilled at now. It is 0 when s already does and
// Never when it never will.
func Wait(l Limit, s State, need, now int64) int64 {
	deficit := need - s.Tokens
	if deficit <= 0 {
		return 0
	}
	if l.IsBudget() {
		return waitBudget(l, s, need, now)
	}
	if need > l.Burst || l.Amount == 0 {
		return Never
	}
	dt, da := quantum(l)
	steps := ceilDiv(deficit, da)
	hi, lo := bits.Mul64(uint64(steps), uint64(dt))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	// The time since the clock already counts towards the next step.
	elapsed := max(now-s.Clock, 0)
	return int64(lo) - min(elapsed, int64(lo)-1)
}

// Claim is the least refill, in whole steps from s.Clock, with which s
// pays cost: the time the steps take (ms) and the tokens they add
// (millitokens); 0, 0 when the tokens s holds pay already. A debt is
// repaid first. A writer that
// moves the clock by just that much and leaves the rest of the refill
// pending loses nothing (refill is exact in whole steps) and claims only
// the time it needs, so that others can claim the rest.
func Claim(l Limit, s State, cost int64) (ms, tokens int64) {
	deficit := cost - s.Tokens
	if deficit <= 0 || l.Amount == 0 || l.IsBudget() {
		// A budget refills only at a boundary, which Refill crosses.
		return 0, 0
	}
	dt, da := quantum(l)
	steps := ceilDiv(deficit, da)
	if steps > math.MaxInt64/max(dt, da) {
		return math.MaxInt64, math.MaxInt64
	}
	return steps * dt, steps * da
}

// FillTime is how long (ms) a limit takes to refill k millitokens, in
// whole refill steps: any state holding at least Room-k tokens whose
// clock is at least FillTime(l, k) before now is full at now. It lets a
// writer state "the bucket is full", a fact about a whole range of
// states, without knowing exactly which state another writer left. Never
// when the limit does not refill; 0 for k <= 0.
func FillTime(l Limit, k int64) int64 {
	if k <= 0 {
		return 0
	}
	if l.Amount == 0 || l.IsBudget() {
		// A budget does not refill within its period: no span of time
		// says a state is full.
		return Never
	}
	dt, da := quantum(l)
	hi, lo := bits.Mul64(uint64(ceilDiv(k, da)), uint64(dt))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(lo)
}

// TimeToFill is how long (ms) an empty limit takes to refill to its burst,
// the time_to_fill of ADR-119, rounded up; Never when it never refills.
//
// A budget fills at its next boundary, at most its calendar unit's
// longest period away (a 31-day month with a repeated hour): that, so
// that a bucket's TTL (ADR-119) outlives the period it is written in.
func TimeToFill(l Limit) int64 {
	if l.Burst == 0 {
		return 0
	}
	if l.IsBudget() {
		return l.Calendar.Longest()
	}
	if l.Amount == 0 {
		return Never
	}
	hi, lo := bits.Mul64(uint64(l.Burst), uint64(l.Period))
	if hi >= uint64(l.Amount) {
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, uint64(l.Amount))
	if r != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// TimeToRecover is how long (ms) l takes to refill to its burst from the
// lowest a charge can take it (Floor), rounded up; Never when it never
// refills. It is TimeToFill for a limit that takes no debt. A budget in
// debt is full two boundaries on: the first repays the debt, the second
// gives the budget whole.
//
// A bucket that expires before this forgives what its limits owe: the
// next call finds it absent and starts it full. BucketTTL keeps every
// bucket at least this long after its last write.
func TimeToRecover(l Limit) int64 {
	floor := Floor(l)
	if floor == 0 {
		return TimeToFill(l)
	}
	if l.IsBudget() {
		return 2 * l.Calendar.Longest()
	}
	deep := l
	deep.Burst -= floor
	return TimeToFill(deep)
}

func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}
