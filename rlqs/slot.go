package rlqs

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/sluice-rl/sluice/backend"
)

// slot is one bucket of one stream: what its Envoy reported of it, what
// was sent to it, and the tokens taken for it. It lives from the bucket's
// first report until it is abandoned or its stream ends, and belongs to
// its stream's loop (one renewal at a time).
type slot struct {
	// req names the shared bucket (Hits unset); matched is false for an
	// id no rule matches, which is allowed everything.
	req     backend.Request
	matched bool
	// limits: the capacity is known (from a decision on the bucket).
	limits bool
	cap    capacity
	// demand is requests a second (allowed and denied) in the last report
	// that covered time; negative until one has.
	demand float64
	// allowed is every request the Envoy reported allowed; issued every
	// token the assignments sent to it could admit (and every debt paid).
	// allowed above issued is a debt: requests the Envoy admitted with no
	// assignment paid for them (before its first, or after one expired).
	allowed, issued uint64
	// bank holds tokens taken from the shared bucket for this slot and
	// not yet in an assignment.
	bank uint64
	// active is the last assignment sent; nil before the first.
	active *assignment
	ttl    time.Duration // of active
	due    int64         // ms: when it is renewed
	seen   int64         // ms: the last report naming it
	// busy is when (ms) a report last counted requests in it: a bucket
	// reported idle for Policy.Idle is abandoned (Envoy reports every
	// bucket it holds, busy or not).
	busy int64
	// early is when (ms) a report last brought the renewal forward.
	early int64
	// asked is what the last renewal asked of the shared bucket beyond
	// its bank, before spares: what the next one likely asks (ahead.go).
	asked uint64
	// short: the last take found the shared bucket unable to give all
	// it asked: the limit is reached.
	short bool
	// replacedMax is the burst of the assignment replaced at replacedAt
	// (ms): its Envoy may admit that much more until the new one lands.
	replacedMax uint64
	replacedAt  int64
}

// debt is what the Envoy admitted beyond what was paid for it, at most a
// burst per renewal: an absurd report costs the bucket little.
func (s *slot) debt() uint64 {
	if s.allowed <= s.issued {
		return 0
	}
	return min(s.allowed-s.issued, max(s.cap.burst, 1))
}

// reclaim moves into the bank, at now, what the slot's Envoy can no
// longer admit: every token issued to it, less what it reported
// admitted and the most its assignments may still admit (a full bucket
// of the active one, and of the one it replaced while that may still
// have been in force, and the active one's fills from the allowance
// before now, for the report's time on the way). A bucket capped at its
// burst while its Envoy asked less, or replaced while it held tokens,
// leaves such tokens; the next renewal takes that much less from the
// shared bucket.
func (s *slot) reclaim(now, allowance int64) {
	a := s.active
	if a == nil || a.Allow {
		return
	}
	hold := a.MaxTokens + fills(a.PerSecond, now-allowance, a.paidUntil)
	if now-s.replacedAt <= 2*allowance {
		hold += s.replacedMax
	}
	if used := s.allowed + hold; s.issued > used {
		s.bank += s.issued - used
		s.issued = used
	}
}

// outstanding is what the slot holds that no Envoy may have admitted
// yet: its bank and the fills of its active assignment still to come.
// When the stream ends these are stranded.
func (s *slot) outstanding(now int64) uint64 {
	n := s.bank
	if a := s.active; a != nil && !a.Allow {
		n += unpaidFills(a.PerSecond, now, a.paidUntil)
	}
	return n
}

// renewal is what one renewal decided.
type renewal struct {
	Strategy
	ttl      time.Duration
	taken    uint64 // tokens taken from the shared bucket for it
	returned uint64 // tokens given up to the replica's spares
	// wait: nothing is sent; the active assignment stands and the
	// renewal is tried again at the slot's due time.
	wait bool
}

// peers is what one replica's streams know together of a shared bucket,
// read at each renewal of a slot of it.
type peers struct {
	// contended: a take of another stream fell short lately. Every
	// Envoy of the bucket is then sized closer to its demand, and a bank
	// beyond a second of its rate goes back to the shared bucket for the
	// Envoys that lack it.
	contended bool
	// newcomers is how many Envoys began reporting the bucket to this
	// replica within a reporting interval of the latest of them
	// (Service.arrive): at least one. It sizes a slot's assignments
	// before its first report with a rate.
	newcomers int
	// spare is what the bucket's Envoys on this replica gave up
	// (settle): a renewal's take is paid from it before the shared
	// bucket is asked.
	spare spare
	// draws is what this replica's decisions tell of the bucket's
	// draws, its own and the other replicas' (draws.go); saw tells it
	// of one more.
	draws draws
	saw   func(level, took uint64, c capacity)
	// ahead claims what the renewals of the bucket's other slots on
	// this replica due soon will ask (ahead.go); nil: none.
	ahead func() uint64
}

// see tells the replica of a decision on the shared bucket that took
// took tokens and left level.
func (p peers) see(level, took uint64, c capacity) {
	if p.saw != nil {
		p.saw(level, took, c)
	}
}

// blindShortWait is how long (ms) at most an Envoy whose demand is not
// known yet waits for its next renewal after one fell short: it may be
// busier than what it got, and the shared bucket refills a tenth of its
// rate in that time. In the simulated fleets of three replicas, 4 to 8
// Envoys at 70% to 80% of the limit had 6.3% to 6.8% of their requests
// denied before the second report, against 8.3% without it (50 runs).
const blindShortWait = 150

// firstShare is the part of what the shared bucket holds that a bucket's
// first assignment costs at most. Envoys that begin together renew
// their first assignments at once, each having read the bucket before
// any of them took from it. Ten Envoys at half the limit over three
// replicas on Redis, each asking a quarter, found it empty from the
// fifth on, and had 7.7% to 10.5% of their requests denied before the
// second report (3 runs); asking an eighth, 1.1% to 4.2% (4 runs, all
// beside other test suites). Simulated (50 runs): 1.1% against 2.5%,
// and a lone Envoy at half the limit, whose first assignment is then
// smaller, 3.5% against 2.2%.
const firstShare = 8

// retrySoon is how long (ms) a renewal that could not pay for its
// active bucket's next second waits before it asks the shared bucket
// again.
const retrySoon = 250

// renew decides the next assignment of s at now, taking from be what it
// needs, and records it as sent. On an error s is unchanged but for
// tokens already taken (kept in its bank) and its active assignment
// stands until it expires; the caller retries.
//
// peers is what the replica's other streams tell of the shared bucket.
func (p Policy) renew(ctx context.Context, be backend.Backend, s *slot, now int64, peers peers) (renewal, error) {
	s.asked = 0
	if !s.matched {
		return p.record(s, Strategy{Allow: true}, p.TTL, now, 0), nil
	}
	held := int64(-1) // what the shared bucket holds, when a check read it
	if !s.limits {
		// One check (no hits) learns the limits that really apply: a
		// record may override the file's.
		_, d, err := take(ctx, be, s.req, 0, 0)
		if errors.Is(err, errPerRequest) {
			return p.record(s, Strategy{}, p.ShortTTL, now, 0), nil
		}
		if err != nil {
			return renewal{}, err
		}
		if !d.Limited() {
			return p.record(s, Strategy{Allow: true}, p.TTL, now, 0), nil
		}
		s.cap, s.limits = capacityOf(d.Limits)
		held = int64(available(d))
		peers.see(uint64(held), 0, s.cap)
	}
	// Over the limit the shared bucket holds little more than its refill
	// since the last take: asking for a whole TTL of fills would find it
	// short every time. A contended bucket is asked for a short TTL.
	hot := peers.contended || s.short
	ttl := p.TTL
	if hot || s.demand < 0 {
		// Contended, or the demand is not known yet: ask again soon.
		ttl = p.ShortTTL
	}
	ttl = p.ttlBefore(ttl, s.cap, now)
	until := now + (ttl + p.Allowance).Milliseconds()
	// Newcomers on other replicas count too: as many more, for each of
	// this replica's, as the others draw for each token it draws.
	goal := p.goal(s, hot, float64(peers.newcomers)/peers.draws.share(s.cap))
	if s.active == nil && s.demand < 0 && held >= 0 {
		// A bucket's first assignment, before any rate is known, costs
		// at most an eighth of what the shared bucket holds
		// (firstShare): Envoys that begin together each find some,
		// and none is left out; the next renewal, a second later at
		// most, gives the share. Not when an eighth pays for less than
		// a token a second (a burst of a few tokens): the first Envoy
		// then gets what there is.
		if first := p.fit(uint64(held)/firstShare, p.ShortTTL, s.cap); first.PerSecond > 0 && first.PerSecond < goal.PerSecond {
			goal = first
		}
	}
	var credit uint64 // what replacing the active bucket gives back
	a := s.active
	if a != nil && !a.Allow {
		credit = unpaidFills(a.PerSecond, now, a.paidUntil)
	}
	// What to ask for: the active bucket's fills to the end of the TTL
	// when it will likely be extended, else a new bucket of the goal.
	// While the bucket is contended, an Envoy below its goal also has
	// its bank filled to what a new bucket would cost, so that refill
	// the active one does not use is not cut by the shared bucket's
	// burst, and the next renewal can raise the rate with it. Not one
	// at or above its goal: a bank filled for it would only keep the
	// refill from the Envoys short of it. short is judged against the
	// least that serves: a second of the active rate, or the goal for
	// the short TTL.
	// A bucket that merely cannot pay a whole TTL at once (its burst is
	// smaller) is not short: the TTL then grows renewal by renewal.
	extending := a != nil && !a.Allow && a.PerSecond > 0 && now < a.expires &&
		(hot || (s.demand >= 0 && float64(a.PerSecond) >= s.demand))
	fresh := goal.MaxTokens + fills(goal.PerSecond, now, until)
	ask, least := fresh, goal.MaxTokens+fills(goal.PerSecond, now, now+(p.ShortTTL+p.Allowance).Milliseconds())
	have := s.bank + credit
	if extending {
		ask = fills(a.PerSecond, a.paidUntil, until)
		least = fills(a.PerSecond, a.paidUntil, now+(time.Second+p.Allowance).Milliseconds())
		have = s.bank
		if hot && a.PerSecond < goal.PerSecond {
			ask = max(ask, fresh)
		}
	}
	debt := s.debt()
	if need := ask + debt; need > have {
		s.asked = need - have
	}
	if need := ask + debt; need > have {
		// The tokens other Envoys of the bucket left unused on this
		// replica pay first: a take they cover writes nothing.
		got := peers.spare.draw(need - have)
		s.bank += got
		have += got
	}
	var taken, kept uint64 // taken from the shared bucket; kept for s
	if need := ask + debt; need > have {
		// Less than the smallest token bucket costs would be a write
		// for a DENY_ALL.
		one := bucketOf(1, s.cap)
		// The renewals of the bucket's other slots here that are due
		// soon are paid with the same write (ahead.go).
		own := need - have
		var soon uint64
		if peers.ahead != nil {
			soon = peers.ahead()
		}
		got, d, err := take(ctx, be, s.req, own+soon, one.MaxTokens+fills(1, now, now+(p.ShortTTL+p.Allowance).Milliseconds()))
		s.bank += got
		taken, kept = got, got
		if err != nil {
			if errors.Is(err, errPerRequest) {
				return p.record(s, Strategy{}, p.ShortTTL, now, taken), nil
			}
			return renewal{}, err
		}
		if !d.Limited() {
			s.limits = false
			return p.record(s, Strategy{Allow: true}, p.TTL, now, taken), nil
		}
		s.cap, _ = capacityOf(d.Limits)
		peers.see(available(d), got, s.cap)
		if soon > 0 {
			// The slot's own renewal is paid first; the others get what
			// is left. Shared in proportion instead, a short bucket sent
			// every Envoy less, each renewed sooner, and the writes saved
			// went on more renewals.
			theirs := got - min(got, own)
			given := peers.spare.give(theirs, max(s.cap.burst, 1))
			s.bank -= given
			kept -= given
		}
	}
	s.short = have+kept < least+debt
	paid := min(s.bank, debt)
	s.bank -= paid
	s.issued += paid
	if a := s.active; a != nil && !a.Allow && a.PerSecond > 0 && now < a.expires {
		better, _ := p.afford(s.bank+credit, goal, ttl, now, s.cap)
		tooBig := float64(a.PerSecond) > 1.25*float64(goal.PerSecond)+1
		if p.keep(s, better, goal, hot) || (better.PerSecond <= a.PerSecond && !tooBig) {
			if ttl := p.extension(s, now, ttl); ttl > 0 {
				return p.settle(s, a.Strategy, ttl, now, taken, hot, peers.spare), nil
			}
			if cut, _ := p.afford(s.bank+credit, goal, ttl, now, s.cap); a.paidUntil-now > 2*p.Allowance.Milliseconds() &&
				(taken == 0 || float64(cut.PerSecond) < s.demand) {
				// Not a second of its rate in the bank yet, but its
				// paid fills run a while: ask again shortly rather
				// than cut the Envoy down to what the bank holds now.
				// After a take, which wrote the shared bucket, only
				// when that would cut it below its reported demand
				// (its requests would be denied): otherwise the
				// renewal sends what it paid for rather than write
				// again for the same assignment. Over the limit, where
				// every Envoy gets less than its demand, a renewal may
				// so write twice.
				s.due = now + retrySoon
				return renewal{taken: taken, wait: true}, nil
			}
		}
	}
	s.bank += credit
	s.issued -= min(s.issued, credit)
	st, ttl := p.afford(s.bank, goal, ttl, now, s.cap)
	if st.PerSecond > 0 {
		c := st.MaxTokens + fills(st.PerSecond, now, now+(ttl+p.Allowance).Milliseconds())
		s.bank -= c
		s.issued += c
	}
	return p.settle(s, st, ttl, now, taken, hot, peers.spare), nil
}

// settle records st as sent and, when the bucket is contended, gives
// what s's bank holds beyond a second of st's rate to the replica's
// spares for the bucket (up to a burst of it), where the next take of
// any of its slots finds it: tokens an Envoy left unused (reclaim) are
// then another's. They were given back to the shared bucket once, a
// write of its own each time, and an eighth of its burst at most so
// that the bucket, which holds at most its burst, would not drop them
// (after a reporting interval's tokens left unused, several bursts came
// back at once). Kept on the replica, they cost no write and none is
// dropped; what the spares cannot hold stays in the bank.
func (p Policy) settle(s *slot, st Strategy, ttl time.Duration, now int64, taken uint64, hot bool, sp spare) renewal {
	r := p.record(s, st, ttl, now, taken)
	if keep := st.PerSecond + 1; hot && s.bank > keep {
		r.returned = sp.give(s.bank-keep, max(s.cap.burst, 1))
		s.bank -= r.returned
	}
	return r
}

// contendedHeadroom replaces Policy.Headroom while the shared bucket is
// short: a token an Envoy holds beyond its demand is one another lacks.
const contendedHeadroom = 1.05

// goal is the token bucket s's Envoy should have: its demand with
// headroom, less of it when the bucket is contended (hot); before its
// first report, a share of the limit among newcomers (desired).
func (p Policy) goal(s *slot, hot bool, newcomers float64) Strategy {
	if hot {
		p.Headroom = contendedHeadroom
	}
	return p.desired(s.demand, s.cap, newcomers, hot)
}

// keep reports whether s's active bucket should be extended rather than
// replaced by better, the best new one its tokens afford toward goal. A
// new bucket throws away what Envoy's holds and starts full, so the
// active one stands while it covers the demand without much waste, and
// otherwise unless it is well above the goal or a new one would be well
// above it.
func (p Policy) keep(s *slot, better, goal Strategy, hot bool) bool {
	r := float64(s.active.PerSecond)
	waste := 1.5 * p.Headroom
	if hot {
		waste = 1.15
	}
	if s.demand >= 0 && r >= s.demand && r <= waste*s.demand+1 {
		return true
	}
	return r <= 1.25*float64(goal.PerSecond)+1 && float64(better.PerSecond) < 1.2*r
}

// afford is the best bucket tokens pay for toward goal from now: goal
// for the longest TTL up to longest they pay, else the largest rate they
// pay over the short TTL (DENY_ALL when that is none).
func (p Policy) afford(tokens uint64, goal Strategy, longest time.Duration, now int64, c capacity) (Strategy, time.Duration) {
	for ttl := longest; ttl >= p.ShortTTL; ttl -= time.Second {
		if goal.MaxTokens+fills(goal.PerSecond, now, now+(ttl+p.Allowance).Milliseconds()) <= tokens {
			return goal, ttl
		}
	}
	return p.fit(tokens, p.ShortTTL, c), p.ShortTTL
}

// extension pays, from s's bank, for extending its active token bucket
// as long as the bank allows, up to the policy's TTL, and returns that
// TTL: zero when it pays for less than a second.
func (p Policy) extension(s *slot, now int64, longest time.Duration) time.Duration {
	a := s.active
	var best time.Duration
	var cost uint64
	for ttl := time.Second; ttl <= longest; ttl += time.Second {
		c := fills(a.PerSecond, a.paidUntil, now+(ttl+p.Allowance).Milliseconds())
		if c > s.bank {
			break
		}
		best, cost = ttl, c
	}
	s.bank -= cost
	s.issued += cost
	return best
}

// record makes st, sent at now for ttl, the active assignment of s and
// schedules its renewal. A token bucket's fills are paid to the end of
// its TTL and the allowance: an extension's cost (quote) ran them on
// from where the active one's were paid to.
func (p Policy) record(s *slot, st Strategy, ttl time.Duration, now int64, taken uint64) renewal {
	until := now + (ttl + p.Allowance).Milliseconds()
	a := &assignment{Strategy: st, expires: until, paidUntil: until}
	switch {
	case st.Allow || st.Deny():
		a.paidUntil = now
	case s.active != nil && s.active.Strategy == st && now < s.active.expires:
		// Extended: what was paid beyond its new end stays paid.
		a.paidUntil = max(until, s.active.paidUntil)
	}
	if old := s.active; old != nil && (old.Strategy != st || now >= old.expires) {
		s.replacedMax, s.replacedAt = old.MaxTokens, now
	}
	s.active, s.ttl = a, ttl
	// Renewals of one bucket's Envoys are spread over a quarter of the
	// wait, so that over the limit none of them always comes first to
	// the refill.
	lead := p.lead(ttl).Milliseconds()
	wait := ttl.Milliseconds() - lead
	if (s.short || ttl <= p.ShortTTL) && s.cap.perSecond > 0 {
		// The shared bucket holds at most its burst: a refill left
		// in it longer than that is cut. Over the limit its takers come
		// back within half of that time, so none of it is lost.
		wait = min(wait, int64(float64(s.cap.burst)/s.cap.perSecond*500))
	}
	if s.demand < 0 && s.short && !st.Allow {
		wait = min(wait, blindShortWait)
	}
	s.due = now + max(wait-wait/4+rand.Int64N(wait/4+1), 50)
	return renewal{Strategy: st, ttl: ttl, taken: taken}
}
