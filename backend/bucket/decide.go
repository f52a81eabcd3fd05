package bucket

import (
	"math"
	"math/bits"
)

// Result is what one decision found for one limit of the bucket.
type Result struct {
	// Cost asked of this limit, in millitokens.
	Cost int64
	// Tokens left after the decision, in millitokens.
	Tokens int64
	// Allowed reports whether this limit alone had the tokens.
	Allowed bool
	// Wait in milliseconds: for a limit that lacked tokens, until it will
	// have them (Never if it never will); otherwise until it is full again.
	Wait int64
}

// Decide refills every limit to now and admits the request of hits only if
// every limit has the tokens it costs; then it consumes from every limit.
// A denied request consumes nothing. A limit at or below zero (in debt
// after a Charge, or empty) denies even a check of zero hits: the next
// request would be denied, and a gateway that checks before it forwards
// and charges after the response must stop forwarding. states is updated
// in place (refill is applied either way, which changes no future
// decision) and results, which must have the length of limits, receives
// one Result per limit. A store that persists states may skip the write
// when Decide returns false.
func Decide(limits []Limit, states []State, hits uint64, now int64, results []Result) bool {
	allowed := judge(limits, states, hits, now, results)
	for i, l := range limits {
		r := &results[i]
		if allowed && r.Cost > 0 {
			states[i].Tokens -= r.Cost
			states[i].Consumed = satAdd(states[i].Consumed, r.Cost)
			states[i].AtRoomSince = 0
		}
		settle(l, states[i], r, now, false)
	}
	return allowed
}

// Charge counts hits already used (tokens a response reported when it
// ended): unlike Decide it consumes from every limit whatever the limit
// holds, down to its Bottom (its floor, less what leases hold), the debt
// refill repays before the limit
// admits anything again. What the floor cuts off is not taken from the
// tokens but still counts in Consumed, which is what was used. It reports
// whether every limit held the tokens (what Decide would have answered),
// and fills results as Decide does; a limit left at or below zero waits
// until it is above zero again.
func Charge(limits []Limit, states []State, hits uint64, now int64, results []Result) bool {
	return ChargeLess(limits, states, hits, nil, now, results)
}

// ChargeLess is Charge less what was paid elsewhere: paid[i] millitokens
// of limit i's cost (nil: nothing), taken already from a lease that held
// some but not all of it. Those tokens left the bucket when the lease was
// granted, and count as consumed there; the rest is charged here.
func ChargeLess(limits []Limit, states []State, hits uint64, paid []int64, now int64, results []Result) bool {
	allowed := judge(limits, states, hits, now, results)
	if paid != nil {
		allowed = true
		for i := range results {
			r := &results[i]
			if i < len(paid) && paid[i] > 0 {
				r.Cost = max(r.Cost-paid[i], 0)
				r.Allowed = r.Cost == 0 || (states[i].Tokens >= r.Cost && states[i].Tokens > 0)
			}
			allowed = allowed && r.Allowed
		}
	}
	for i, l := range limits {
		r := &results[i]
		if r.Cost > 0 {
			s := &states[i]
			s.Tokens = max(s.Tokens-r.Cost, min(Bottom(l, *s), s.Tokens))
			s.Consumed = satAdd(s.Consumed, r.Cost)
			s.AtRoomSince = 0
		}
		settle(l, states[i], r, now, true)
	}
	return allowed
}

// Charged is the Result for limit l of a charge of cost that left it at
// s, for a store that charges in a script of its own and reads back only
// the state after: held is whether the limit held the cost (what Charge
// reports for it).
func Charged(l Limit, s State, cost int64, held bool, now int64) Result {
	r := Result{Cost: cost, Allowed: held}
	settle(l, s, &r, now, true)
	return r
}

// judge refills every limit of states to now and records in results what
// hits cost each and whether it holds that much (and more than zero).
func judge(limits []Limit, states []State, hits uint64, now int64, results []Result) bool {
	allowed := true
	for i, l := range limits {
		states[i] = Refill(l, states[i], now)
		c := Cost(l, hits)
		ok := states[i].Tokens >= c && states[i].Tokens > 0
		results[i] = Result{Cost: c, Allowed: ok}
		allowed = allowed && ok
	}
	return allowed
}

// settle fills in r's tokens left and wait from s after a decision: for a
// denied limit, until it can pay (above zero, for a check); after a
// charge, until the limit is above zero again; otherwise until it is
// full.
func settle(l Limit, s State, r *Result, now int64, charged bool) {
	r.Tokens = s.Tokens
	switch {
	case !r.Allowed && !charged:
		r.Wait = Wait(l, s, max(r.Cost, 1), now)
	case charged && s.Tokens <= 0:
		r.Wait = Wait(l, s, 1, now)
	default:
		r.Wait = Wait(l, s, l.Burst, now)
	}
}

// Refund gives hits back to every limit (an is_negative_hits request),
// refilling first and never lifting a limit above its Room (the burst less
// what its leases hold). results
// receives the state after the refund, as for an allowed decision.
func Refund(limits []Limit, states []State, hits uint64, now int64, results []Result) {
	for i, l := range limits {
		s := Refill(l, states[i], now)
		room := Room(l, s)
		s.Tokens = min(room, s.Tokens+RefundAmount(l, hits))
		if s.Tokens == room {
			s.Clock = now
			if s.AtRoomSince == 0 {
				s.AtRoomSince = now
			}
		}
		states[i] = s
		results[i] = Result{Tokens: s.Tokens, Allowed: true, Wait: Wait(l, s, l.Burst, now)}
	}
}

// Binding picks the limit that explains a decision: of the limits that
// denied it, the one with the longest wait; when nothing denied, the one
// with the fewest tokens left relative to its burst. Ties go to the first.
// It returns -1 for an empty bucket.
func Binding(limits []Limit, results []Result) int {
	best := -1
	for i := range limits {
		if best < 0 {
			best = i
			continue
		}
		r, b := results[i], results[best]
		switch {
		case !r.Allowed && b.Allowed:
			best = i
		case !r.Allowed && !b.Allowed:
			if longer(r.Wait, b.Wait) {
				best = i
			}
		case r.Allowed && b.Allowed:
			if lessFull(r.Tokens, limits[i].Burst, b.Tokens, limits[best].Burst) {
				best = i
			}
		}
	}
	return best
}

// longer orders waits with Never as the longest.
func longer(a, b int64) bool {
	if b == Never {
		return false
	}
	return a == Never || a > b
}

// lessFull reports whether t1/b1 < t2/b2 without division or overflow. An
// empty burst counts as empty.
func lessFull(t1, b1, t2, b2 int64) bool {
	if b1 == 0 || b2 == 0 {
		return b1 == 0 && b2 != 0
	}
	h1, l1 := bits.Mul64(uint64(t1), uint64(b2))
	h2, l2 := bits.Mul64(uint64(t2), uint64(b1))
	return h1 < h2 || (h1 == h2 && l1 < l2)
}

func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// Reconcile carries a bucket's states over to a changed set of limits
// (raised, lowered, added or removed), matching limits by name. A kept
// limit is refilled at its old rate up to now, then capped at its new
// Room (its leases stay out: the tokens they hold were taken under the
// old limits and may still be spent) and its debt at its new Floor (what
// was used stays used; a debt the new limit does not allow is forgiven);
// a new limit starts full; a removed limit is dropped, and its leases
// with it.
//
// A budget changed to another of the same calendar and zone keeps what
// was used of the period: its tokens move by the difference between the
// budgets (10 million lowered to 5 with 3 used leaves 2; raised to 20,
// 17), then are capped and floored as any limit's. A budget that becomes
// a rate, a rate that becomes a budget, or a budget whose calendar or
// zone changes keeps its tokens (a budget, as it stands, without the
// boundary its old calendar may have passed; a rate, refilled), capped
// and floored, and its clock moves to now: the new limit's current
// period, or refill from now, never from a time the old limit's
// arithmetic left on the clock.
func Reconcile(old []Limit, states []State, limits []Limit, now int64) []State {
	next := make([]State, len(limits))
	for i, l := range limits {
		next[i] = Full(l, now)
		for j, o := range old {
			if o.Name != l.Name {
				continue
			}
			s := states[j]
			switch {
			case o.IsBudget() && o.CalendarKey() == l.CalendarKey():
				s = Refill(o, s, now)
				s.Tokens += l.Amount - o.Amount
			case o.IsBudget():
				// Another calendar, or a rate: what the old budget holds,
				// from now on.
			default:
				s = Refill(o, s, now)
			}
			if o.CalendarKey() != l.CalendarKey() {
				s.Clock = max(s.Clock, now)
			}
			if room := Room(l, s); s.Tokens >= room {
				s.Tokens, s.Clock = room, now
			}
			s.Tokens = max(s.Tokens, Bottom(l, s))
			next[i] = s
			break
		}
	}
	return next
}
