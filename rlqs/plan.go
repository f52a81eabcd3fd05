package rlqs

import (
	"math"
	"time"

	"github.com/sluice-rl/sluice/backend/bucket"
)

// Policy sizes and times assignments. The zero Policy takes the
// defaults named on each field; TTL, ShortTTL and Lead are rounded to
// whole seconds, the only TTLs Envoy's filter keeps.
type Policy struct {
	// TTL is the assignment_time_to_live of a token bucket sized to an
	// Envoy's demand (10 s). A replica takes every token the assignment
	// can admit before it ends, so a longer TTL means fewer backend writes
	// and more tokens stranded when a stream ends.
	TTL time.Duration
	// ShortTTL is that of an assignment made over the limit: DENY_ALL, or
	// a token bucket of what was left (1 s), so the Envoy asks again soon.
	ShortTTL time.Duration
	// Lead is how long before an assignment ends it is renewed (2 s; at
	// most half its TTL).
	Lead time.Duration
	// Allowance is how late after its sending an assignment may reach
	// Envoy (250 ms): its fills are paid for that much longer. A replaced
	// assignment's fills are credited back from the moment the new one is
	// sent: what Envoy's old bucket fills until the new one arrives shows
	// in its reports as admitted beyond what was paid, and is charged to
	// the shared bucket then (slot.debt).
	Allowance time.Duration
	// Headroom is the token bucket's rate over the demand the Envoy
	// reported (1.25): steady demand is never denied, and a rise of a
	// quarter is absorbed until the next report.
	Headroom float64
	// Idle is how long a bucket may go without requests (reported with
	// none, or not reported) before it is abandoned (30 s): Envoy
	// forgets it, and the replica its assignment.
	Idle time.Duration
}

// withDefaults fills the zero fields of p.
func (p Policy) withDefaults() Policy {
	sec := func(d, def time.Duration) time.Duration {
		if d <= 0 {
			return def
		}
		return max(time.Second, d.Round(time.Second))
	}
	p.TTL = sec(p.TTL, 10*time.Second)
	p.ShortTTL = sec(p.ShortTTL, time.Second)
	p.ShortTTL = min(p.ShortTTL, p.TTL)
	p.Lead = sec(p.Lead, 2*time.Second)
	if p.Allowance <= 0 {
		p.Allowance = 250 * time.Millisecond
	}
	if p.Headroom < 1 {
		p.Headroom = 1.25
	}
	if p.Idle <= 0 {
		p.Idle = 30 * time.Second
	}
	return p
}

// ttlBefore is ttl, shortened so that an assignment sent at now for it
// (and the allowance) ends by the boundary of c's budgets, less the
// writers' margin: tokens a period paid for are not spent in the next.
// It is never under a second, Envoy's least TTL: an assignment sent in
// the last seconds of a period may be spent a second and the allowance
// into the next (docs/rules.md, budgets).
func (p Policy) ttlBefore(ttl time.Duration, c capacity, now int64) time.Duration {
	end := bucket.LeaseEndOf(c.budgets, now)
	if left := end - now - p.Allowance.Milliseconds(); left < ttl.Milliseconds() {
		ttl = max(time.Second, (time.Duration(left) * time.Millisecond).Truncate(time.Second))
	}
	return ttl
}

// lead is how long before the end of an assignment of ttl it is renewed.
func (p Policy) lead(ttl time.Duration) time.Duration { return min(p.Lead, ttl/2) }

// capacity is what a bucket's limits allow, in whole tokens: the
// smallest rate (per second) and burst of its limits.
type capacity struct {
	perSecond float64
	burst     uint64
	// budgets are the limits that are budgets for a calendar period: an
	// assignment ends by their boundary (bucket.LeaseEndOf).
	budgets []bucket.Limit
}

// capacityOf reads the capacity of limits; ok is false when there are
// none.
func capacityOf(limits []bucket.Limit) (c capacity, ok bool) {
	for i, l := range limits {
		rate := float64(l.Amount) / float64(bucket.Milli) * 1000 / float64(l.Period)
		burst := uint64(l.Burst / bucket.Milli)
		if i == 0 || rate < c.perSecond {
			c.perSecond = rate
		}
		if i == 0 || burst < c.burst {
			c.burst = burst
		}
		if l.IsBudget() {
			c.budgets = append(c.budgets, l)
		}
	}
	return c, len(limits) > 0
}

// desired is the token bucket an Envoy asking demand requests a second
// (negative: not reported yet) should get under c: its demand with
// headroom. Before any report it gets a share of the limit, for a short
// TTL, and its next report sizes it: half the limit, a quarter while
// the shared bucket is short (hot), or less when more Envoys
// (newcomers) began reporting the bucket to this replica within a
// reporting interval, so that Envoys that start together ask at most
// four fifths of the limit between them (each replica counts its own,
// and counts as many more for the other replicas as their part of the
// bucket's draws says: draws.share).
// Too small a share denies an Envoy busier than it until its first
// report; too large leaves the shared bucket short, and the Envoys that
// started with it denied. What an Envoy leaves unused comes back after
// its report.
func (p Policy) desired(demand float64, c capacity, newcomers float64, hot bool) Strategy {
	if demand < 0 {
		share := 2.0
		if hot {
			share = 4
		}
		demand = c.perSecond / max(share, 1.25*newcomers) / p.Headroom
	}
	// Absurd reports (2^64-1 requests) ask at most what the limit could
	// ever give in a TTL; the take trims it to what the bucket holds.
	r := math.Ceil(math.Min(demand*p.Headroom, 2*c.perSecond+float64(c.burst)+1))
	r = max(r, 1)
	return bucketOf(uint64(r), c)
}

// bucketOf is the token bucket of rate r under c. Envoy refills its
// bucket continuously, so its burst need only absorb the unevenness of
// arrivals: a quarter second of the rate, at least ten tokens (or the
// rate, when less), never above the limit's own burst. A smaller burst
// is a smaller sum paid before the assignment is sent.
func bucketOf(r uint64, c capacity) Strategy {
	if r == 0 {
		return Strategy{}
	}
	m := max((r+3)/4, min(r, 10))
	return Strategy{PerSecond: r, MaxTokens: min(m, max(c.burst, 1))}
}

// quote is what renewing or replacing an Envoy's active assignment with
// want, ending at until (ms), costs at now: the tokens to take, and the
// tokens the replaced assignment gives back (its fills still to come,
// which Envoy will not make once the new one arrives). extend: want
// equals the active assignment, which Envoy then keeps and lengthens.
func (p Policy) quote(active *assignment, want Strategy, now, until int64) (cost, credit uint64, extend bool) {
	if active != nil && !active.Allow && active.PerSecond > 0 && active.Strategy == want && now < active.expires {
		return fills(want.PerSecond, active.paidUntil, until), 0, true
	}
	if active != nil && !active.Allow {
		credit = unpaidFills(active.PerSecond, now, active.paidUntil)
	}
	return want.MaxTokens + fills(want.PerSecond, now, until), credit, false
}

// fit is the largest token bucket (bucketOf) that tokens pay for over
// ttl (plus the allowance) from now. Zero PerSecond (DENY_ALL) when they
// pay for less than one token a second.
func (p Policy) fit(tokens uint64, ttl time.Duration, c capacity) Strategy {
	span := float64((ttl + p.Allowance).Milliseconds()) / 1000
	r := uint64(math.Floor(float64(tokens) / (0.25 + span)))
	for r > 0 && bucketOf(r, c).MaxTokens+fills(r, 0, (ttl+p.Allowance).Milliseconds()) > tokens {
		r-- // the burst's floor of ten, and float rounding
	}
	return bucketOf(r, c)
}
