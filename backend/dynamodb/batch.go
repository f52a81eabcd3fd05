package dynamodb

// A batch is the calls queued on one bucket (or a cascade's two) that one
// conditional write decides: planned from the last state seen and the
// replica's lease, retried from what the table returns when the write
// loses its race, and settled into answers, lease grants and the state
// the next batch starts from.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/lease"
)

// contendedAttempts is how many writes a batch near its bucket's limit
// tries, with leases, before its calls are denied as contended.
const contendedAttempts = 2

// errLimitsChanged stops a batch whose write lost its race to another
// replica's rewrite of a bucket under other limits than the batch's own:
// the limits changed (a share that moved, records edited) while its calls
// waited, and a retry would rewrite the bucket back to the old ones,
// losing to every write of the replicas on the new ones, round after
// round, while the calls behind it wait for the lane. The calls resolve
// their limits again instead (Decide).
var errLimitsChanged = errors.New("bucket rewritten under other limits")

// contendedError fails a decision far from its bucket's limit whose
// writes lost their races to other replicas' until it ran out of
// attempts (Options.MaxAttempts): the failure policy answers it. Near
// the limit such a decision is denied instead. attempts is 0 where the
// count is not known.
type contendedError struct{ attempts int }

func (e contendedError) Error() string {
	if e.attempts == 0 {
		return "gave up after contended writes"
	}
	return fmt.Sprintf("gave up after %d contended writes", e.attempts)
}

// cfgs lists the limits (cfg) each target's item carries as last seen,
// "" for none.
func cfgs(ts []target) []string {
	out := make([]string, len(ts))
	for i := range ts {
		if it := ts[i].item; it != nil {
			out[i] = it.cfg
		}
	}
	return out
}

// rewritten reports whether, after a lost race, some target's item was
// found under other limits than both the ones it carried before (before,
// from cfgs) and the target's own: another replica rewrote it.
func rewritten(ts []target, before []string) bool {
	for i := range ts {
		if it := ts[i].item; it != nil && it.cfg != before[i] && it.cfg != ts[i].fp {
			return true
		}
	}
	return false
}

// unsure reports whether batch is all guessed calls and some target's
// item holds other limits than the guess gave it.
func unsure(ts []target, batch []*call) bool {
	for _, c := range batch {
		if !c.guessed && !c.done {
			return false
		}
	}
	for i := range ts {
		if it := ts[i].item; it != nil && it.cfg != ts[i].fp {
			return true
		}
	}
	return false
}

// decideBatch decides the calls of batch, in order, on the buckets ts
// name (the first call's; every call of a batch resolved them alike),
// and writes the outcome with one conditional write. Each call gets its
// own answer. A lost race recomputes every call from the state the table
// returned; a call whose context ends is left out of the next attempt.
//
// With leases, what this replica's lease on a bucket still holds is
// folded into a batch that pays for anything (or returns the lease): the
// calls are decided on the bucket and the lease together, and the write
// takes from the bucket only what the lease does not cover, plus the
// next lease's grant, or gives back what is left over. A write that
// certainly did not happen (every attempt lost) puts the lease back; one
// whose outcome is unknown drops it, since it may have returned it.
func (b *Backend) decideBatch(ctx context.Context, ts []target, batch []*call) {
	// Read the last seen state only now: the batch that held the lane
	// before this one may have just updated it.
	b.loadSeen(ts)
	b.markShared(ts)
	if b.leases != nil && b.payFromLease(ts, batch) {
		return
	}
	if unsure(ts, batch) {
		for _, c := range batch {
			if !c.done {
				c.err = errUnsureGuess
				c.finish()
			}
		}
		return
	}
	fold, mayGrant := b.leasePlan(ts, batch)
	for i := range ts {
		ts[i].lostRace = false
	}
	live := make([]*call, 0, len(batch))
	for attempt := 1; ; attempt++ {
		live = live[:0]
		for _, c := range batch {
			if c.done {
				continue
			}
			if c.gone() {
				continue
			}
			live = append(live, c)
		}
		if len(live) == 0 {
			b.unfold(ts, fold, true)
			return
		}
		now := b.now()
		write, needView := decideCalls(ts, live, now)
		if (needView && !b.recentEnough(ts, now)) || (write && b.readFirst(ts, live, now)) || b.passedOnOld(ts, live) {
			// Decided on a view too old to trust for a denial (a refund or
			// a raised limit elsewhere), for a bulk take's write on a
			// bucket others write, or for a check that passed on a view
			// others may have spent since: ask the table.
			if err := b.refresh(ctx, ts); err != nil {
				b.unfold(ts, fold, true) // nothing written yet
				fail(live, err)
				return
			}
			continue
		}
		if b.settle(ts, now, mayGrant) {
			write = true
		}
		// Denials and checks stand on a view recent enough to deny from:
		// they are answered now, whatever becomes of the write, so that a
		// write that keeps losing races on a bucket at its limit holds up
		// (and, at worst, fails) only the calls it would admit.
		n := 0
		for _, c := range live {
			if c.kind != decide || (c.req.Hits > 0 && (c.allowed || (c.req.Charge && !c.req.Refund))) {
				live[n] = c
				n++
				continue
			}
			if !asked(ts) {
				b.stats.LocalAnswers.Add(1)
			}
			c.finish()
		}
		live = live[:n]
		if !write {
			b.written(ts, live, now, false)
			return
		}
		before := cfgs(ts)
		err := b.write(ctx, ts, now)
		if err == nil {
			b.written(ts, live, now, true)
			return
		}
		var lost errLostRace
		if !errors.As(err, &lost) {
			b.unfold(ts, fold, false)
			fail(live, err)
			return
		}
		b.stats.ConditionRetries.Add(1)
		for i := range ts {
			b.raced.Add(ts[i].key, now)
			ts[i].lostRace = true
		}
		if unsure(ts, live) {
			b.unfold(ts, fold, true)
			fail(live, errUnsureGuess)
			return
		}
		if rewritten(ts, before) {
			b.unfold(ts, fold, true)
			fail(live, errLimitsChanged)
			return
		}
		contendedNow := b.leases != nil && attempt >= contendedAttempts && attempt < b.opts.MaxAttempts && nearLimit(ts, now)
		if (contendedNow || attempt >= b.opts.MaxAttempts) && attempt < chargeAttempts && b.keepCharging(ts, live, now) {
			// The charges among the calls are retried until they land
			// (what they count was used already); the others have been
			// answered as they would have been without them.
			if err := sleep(ctx, backoff(attempt-1)); err != nil {
				b.unfold(ts, fold, true)
				fail(live, fmt.Errorf("bucket %q/%q: %w", ts[0].key.entity, ts[0].key.resource, err))
				return
			}
			continue
		}
		if contendedNow {
			// With leases, a batch is calls that queued behind a write, and
			// near the limit the other replicas' writes, one a round trip
			// each, take the refill before every retry of it lands: the
			// calls behind it would wait out their deadlines for the lane.
			b.unfold(ts, fold, true)
			b.contended(ts, live, now)
			return
		}
		if attempt >= b.opts.MaxAttempts {
			b.unfold(ts, fold, true)
			if nearLimit(ts, now) {
				b.contended(ts, live, now)
				return
			}
			fail(live, fmt.Errorf("bucket %q/%q: %w", ts[0].key.entity, ts[0].key.resource, contendedError{attempt}))
			return
		}
		// The first retry starts at once from the state the race returned;
		// later ones back off, with jitter, as the bucket is contended.
		if attempt > 1 {
			if err := sleep(ctx, backoff(attempt-1)); err != nil {
				b.unfold(ts, fold, true)
				fail(live, fmt.Errorf("bucket %q/%q: %w", ts[0].key.entity, ts[0].key.resource, err))
				return
			}
		}
	}
}

// racedFor is how long (ms) after a lost race on a bucket its bulk takes
// read it before they write (readFirst). Once it has passed, one more
// lost race starts it again: a minute costs a bucket that several
// replicas take from in bulk one lost write a minute per replica, and a
// bucket that only this replica writes no read at all.
const racedFor = 60_000

// readFirst reports whether calls, decided on ts's view that this
// decision has not read, include a bulk take on a bucket another replica
// has been writing lately (a race lost on it within racedFor): that
// view is then likely stale. A bulk take comes seldom (a quota
// assignment's, every few seconds for each Envoy), so others' writes
// have most likely changed the bucket since this replica's last one
// (two in three with three replicas writing it), and a write planned on
// what it saw then fails its condition and is made again: a write billed
// for nothing. One strongly consistent read costs less, and the write
// after it lands unless another comes in between.
func (b *Backend) readFirst(ts []target, calls []*call, now int64) bool {
	if asked(ts) || !slices.ContainsFunc(calls, func(c *call) bool { return c.req.Bulk && !c.req.Refund && c.req.Hits > 0 }) {
		return false
	}
	for i := range ts {
		if at, ok := b.raced.Peek(ts[i].key); ok && now-at < racedFor {
			return true
		}
	}
	return false
}

// payFromLease answers the calls of batch that this replica's lease pays
// for, in order, as Decide would have on arrival: the write a batch
// waited for may have filled the lease. Once one call cannot be paid the
// rest go to the write, so that calls are still decided in order. It
// reports whether every call was answered.
func (b *Backend) payFromLease(ts []target, batch []*call) bool {
	for _, c := range batch {
		if c.done {
			continue
		}
		if c.kind == decide && c.gone() {
			// A write for it would only hold the lane a round trip for
			// an answer nobody reads.
			continue
		}
		if c.kind != decide || c.req.Refund || c.req.Bulk {
			return false
		}
		d, ok := b.spend(ts, c.req, backend.LevelNone, false)
		if !ok {
			return false
		}
		c.allowed, c.limits, c.results = d.Allowed, d.Limits, d.Results
		if !c.finish() {
			// Its caller had gone: the tokens go back to the lease.
			b.unclaimed(ts, c)
		}
	}
	return true
}

// leasePlan withdraws the leases of ts into the batch when it pays for
// anything or returns them (fold), and says whether its write may grant
// new leases: not for a refund (given back exactly, nothing more) nor for
// a return alone. The batch's calls counted as demand when they arrived
// (spend).
//
// Every write that folds or renews a lease reports on it (backend.Fold,
// backend.Renewing): the item counts out what this replica's leases
// hold (bucket.State.Out), and learns only from the report what of it
// was spent. A lease whose report another write carries is neither
// folded nor granted to.
func (b *Backend) leasePlan(ts []target, batch []*call) (fold, mayGrant bool) {
	for i := range ts {
		ts[i].lease, ts[i].grant, ts[i].keep, ts[i].kept = nil, nil, nil, nil
		ts[i].rep, ts[i].reporting, ts[i].leaseW = backend.LeaseReport{}, false, 0
	}
	if b.leases == nil {
		return false, false
	}
	paying, refund, giving := false, false, false
	for _, c := range batch {
		switch {
		case c.kind == giveBack:
			giving = true
		case c.kind == decide && c.req.Refund:
			refund = true
		case c.kind == decide && c.req.Hits > 0:
			paying = true
		}
	}
	now := b.now()
	for i := range ts {
		t := &ts[i]
		lb := t.leased()
		if refund {
			continue
		}
		t.leaseW, t.newWin = b.leases.LeaseWindowMs(), b.leases.NextWindow(now)
		// A renewal folds a lease taken under other limits: its grant
		// under the new ones could not be added to it.
		if paying || giving || b.leases.Foreign(&lb) {
			if tokens, rep, ok := b.leases.Fold(&lb); ok {
				t.lease, t.rep, t.reporting = tokens, rep, true
				fold = true
			}
		} else if keep, rep, ok := b.leases.Renewing(&lb); ok {
			t.keep, t.rep, t.reporting = keep, rep, true
			fold = true
		}
	}
	return fold, !refund && (paying || !giving)
}

// unfold settles the leases a batch withdrew and did not write: put back
// when the write certainly did not happen (sure), dropped otherwise.
func (b *Backend) unfold(ts []target, fold, sure bool) {
	if !fold {
		return
	}
	for i := range ts {
		lb := ts[i].leased()
		if sure {
			b.leases.Restore(&lb, ts[i].lease)
		} else {
			b.leases.Drop(ts[i].lease)
		}
		if ts[i].reporting {
			b.leases.Unreported(&lb, ts[i].rep, sure)
			ts[i].reporting = false
		}
		ts[i].lease = nil
	}
}

// settle turns each target's decided states (the bucket and any folded
// lease together, after the calls) into what its bucket holds after the
// write: less the grant of a new lease, when the batch may grant one.
// Each limit's consumed total (tc) grows by what the write takes from
// the bucket, lease grants included, and never shrinks: every token ever
// admitted has been counted there once, when it left the bucket. It
// reports whether the write changes any bucket's tokens.
func (b *Backend) settle(ts []target, now int64, mayGrant bool) bool {
	changes := false
	for i := range ts {
		t := &ts[i]
		var asks []lease.Ask
		if mayGrant && t.reporting {
			lb := t.leased()
			asks = b.leases.Asks(&lb, t.view(), now, b.rtt.Ms())
		}
		t.grant = nil
		for j, l := range t.res.Limits {
			s := &t.states[j]
			var g int64
			if asks != nil {
				a := asks[j]
				a.Avail = s.Tokens
				g = b.leases.Policy().Size(l, a)
			}
			if t.reporting {
				// The grant, and what a renewal keeps of its lease, are
				// out on lease until the new window.
				next, ok := bucket.Lend(*s, t.newWin, g, t.kept[j])
				if !ok {
					g, t.kept[j] = 0, 0
				} else {
					*s = next
				}
				if g > 0 {
					if t.grant == nil {
						t.grant = make([]int64, len(t.res.Limits))
					}
					t.grant[j] = g
				}
			}
			taken := bucket.Refill(l, t.base[j], now).Tokens + at(t.credit, j) - s.Tokens
			if !t.refund {
				// A refund's batch counts what its calls consumed, as
				// bucket.Apply did; any other counts what left the bucket.
				s.Consumed = t.base[j].Consumed
				if taken > 0 {
					s.Consumed = satAdd(s.Consumed, taken)
				}
				if f := at(t.forgiven, j); f > 0 {
					s.Consumed = satAdd(s.Consumed, f)
				}
			}
			changes = changes || taken != 0 || s.Out != t.base[j].Out
		}
	}
	return changes
}

// at is v[i], or 0 past its end.
func at(v []int64, i int) int64 {
	if i < len(v) {
		return v[i]
	}
	return 0
}

func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// nearLimit reports whether some limit of ts, as the table last
// returned it and refilled to now, holds less than a tenth of its burst:
// writes that keep losing there lose to other replicas taking the last
// tokens. Far from its limit they lose to sheer contention (leases off),
// and giving up is an error for the failure policy, not a denial.
func nearLimit(ts []target, now int64) bool {
	for i := range ts {
		if ts[i].item == nil {
			continue
		}
		for _, l := range ts[i].res.Limits {
			if s, ok := ts[i].item.StateOf(l.Name); ok && bucket.Refill(l, s, now).Tokens < l.Burst/10 {
				return true
			}
		}
	}
	return false
}

// contended answers the calls of a batch whose write lost every race
// near the limit: other replicas got the last tokens first.
// Each is denied, with the time its cost takes to refill as the wait:
// the fleet stays within its bound, and every call gets a decision.
// chargeAttempts bounds the writes a batch makes for a charge that keeps
// losing races (its deadline bounds them too).
const chargeAttempts = 64

// keepCharging answers the calls a contended batch (or one out of
// attempts) would give up on, all but its charges (backend.Request.
// Charge), and reports whether charges are left to write: a charge is
// never denied nor dropped for contention. The others are denied near
// the limit, as contended would, and failed otherwise.
func (b *Backend) keepCharging(ts []target, calls []*call, now int64) bool {
	if !slices.ContainsFunc(calls, func(c *call) bool { return c.kind == decide && c.req.Charge && !c.req.Refund }) {
		return false
	}
	near := nearLimit(ts, now)
	for _, c := range calls {
		if c.kind != decide || (c.req.Charge && !c.req.Refund) {
			continue
		}
		if near {
			c.deny()
			b.stats.Contended.Add(1)
		} else {
			c.err = fmt.Errorf("bucket %q/%q: %w", ts[0].key.entity, ts[0].key.resource, contendedError{})
		}
		c.finish()
	}
	return true
}

func (b *Backend) contended(ts []target, calls []*call, now int64) {
	for _, c := range calls {
		if c.kind == decide {
			c.deny()
			b.stats.Contended.Add(1)
		}
		c.finish()
	}
}

// written completes the calls of a batch whose write succeeded (wrote),
// or needed none, every one of them admitted: each reports the tokens it
// left, shifted by whatever other writers did meanwhile (which the
// table's answer shows). The leases get what the write granted them.
func (b *Backend) written(ts []target, calls []*call, now int64, wrote bool) {
	if wrote && b.opts.OnBucketWrite != nil {
		for i := range ts {
			b.opts.OnBucketWrite(backend.TTLDuration(backend.BucketTTL(ts[i].res, b.opts.TTLMultiplier)))
		}
	}
	if b.leases != nil {
		b.leaseWritten(ts, now, wrote)
	}
	if wrote && guessedOnly(calls) {
		for i := range ts {
			b.markGuessed(&ts[i])
		}
	}
	off := 0
	for i := range ts {
		for j, l := range ts[i].res.Limits {
			if !wrote || ts[i].item == nil {
				break // no newer state of the table to report from
			}
			s, ok := ts[i].item.StateOf(l.Name)
			if !ok {
				continue
			}
			table := bucket.Refill(l, s, now)
			shift := table.Tokens - ts[i].states[j].Tokens
			for _, c := range calls {
				if c.kind != decide {
					continue
				}
				r := &c.results[off+j]
				r.Tokens = min(max(r.Tokens+shift, min(r.Tokens, 0)), l.Burst)
				st := bucket.State{Tokens: r.Tokens, Clock: table.Clock}
				if c.req.Charge && !c.req.Refund && r.Tokens <= 0 {
					// In debt after a charge: until it is above zero.
					r.Wait = bucket.Wait(l, st, 1, now)
				} else {
					r.Wait = bucket.Wait(l, st, l.Burst, now)
				}
			}
		}
		off += len(ts[i].res.Limits)
	}
	decided := 0
	for _, c := range calls {
		if c.kind == decide {
			decided++
		}
		if !c.finish() && b.leases != nil && c.kind == decide && c.allowed && !c.req.Refund && !c.req.Charge {
			// The write took the call's tokens after its caller had
			// stopped waiting: nobody spent them, and they are lost.
			costs := make([]int64, len(c.results))
			for j, r := range c.results {
				costs[j] = r.Cost
			}
			b.leases.Drop(costs)
		}
	}
	b.stats.Coalesced.Add(uint64(max(decided-1, 0)))
}

// guessedOnly reports whether calls are decisions on a guess of their
// limits, all of them.
func guessedOnly(calls []*call) bool {
	for _, c := range calls {
		if c.kind != decide || !c.guessed {
			return false
		}
	}
	return len(calls) > 0
}

// markGuessed marks t's item, as written by a batch of guessed calls
// alone, seenItem.guessed when that write created it: planned as new
// (create, unseen), and its consumed totals are only what this write
// counted (an unseen write that took from a bucket another replica had
// made adds to the totals it found).
func (b *Backend) markGuessed(t *target) {
	it := t.item
	if it == nil || (t.mode != create && t.mode != unseen) || it.cfg != t.fp {
		return
	}
	for j, l := range t.res.Limits {
		if s, ok := it.StateOf(l.Name); !ok || j >= len(t.states) || s.Consumed != t.states[j].Consumed {
			return
		}
	}
	if s, ok := b.seen.Peek(t.key); ok && s.item == it {
		s.guessed = true
		b.seen.Add(t.key, s)
	}
}

// unclaimed puts the tokens an admitted call took from this replica's
// lease back into it: its caller stopped waiting before the answer came,
// and was answered by the failure policy, so they were spent by nobody,
// and the item still counts them out. A call the write admitted is not
// put back (written drops its tokens): they left the bucket as spent, not
// as a lease, and a lease that spent them later could spend them on top
// of a bucket refilled meanwhile.
func (b *Backend) unclaimed(ts []target, c *call) {
	off := 0
	for i := range ts {
		n := len(ts[i].res.Limits)
		costs := make([]int64, n)
		for j := range n {
			costs[j] = c.results[off+j].Cost
		}
		lb := ts[i].leased()
		b.leases.Add(&lb, costs, b.now())
		off += n
	}
}

// leaseWritten credits the grants of a write that succeeded (or was not
// needed) to the leases, and counts the tokens it gave back, and those of
// a folded lease that the bucket, refilled meanwhile, could not hold
// (pool caps them at the burst).
func (b *Backend) leaseWritten(ts []target, now int64, wrote bool) {
	leaseWrite := false
	for i := range ts {
		t := &ts[i]
		if t.grant != nil || t.lease != nil {
			leaseWrite = true
		}
		for j, l := range t.res.Limits {
			refilled := bucket.Refill(l, t.base[j], now).Tokens + at(t.credit, j)
			if back := t.states[j].Tokens - refilled; back > 0 {
				b.stats.Returned.Add(uint64(back))
			}
			if j < len(t.lease) {
				if cut := refilled + t.lease[j] - l.Burst; t.lease[j] > 0 && cut > 0 {
					b.stats.LeaseCut.Add(uint64(cut))
				}
			}
		}
		var written []bucket.State
		if !t.refund {
			written = t.states
		}
		lb := t.leased()
		if wrote {
			b.leases.Drop(t.lostBack)
		}
		grant := t.grant
		if t.reporting {
			if wrote {
				b.leases.Reported(&lb, t.kept, t.grant, t.newWin, now)
			} else {
				// Nothing written: the lease is as it was. A grant in a
				// write found not needed only lent again, into the same
				// window, what the lease gave back: those tokens are the
				// lease's once more, and credited twice they would be
				// spent twice.
				b.leases.Restore(&lb, t.lease)
				b.leases.Unreported(&lb, t.rep, true)
				t.lease, grant = nil, nil
			}
			t.reporting = false
		}
		b.leases.Credit(&lb, grant, t.view(), written, now)
		t.lease = nil
	}
	if wrote && leaseWrite {
		b.stats.LeaseWrites.Add(1)
	}
}

// fail answers every call with err.
func fail(calls []*call, err error) {
	for _, c := range calls {
		c.err = err
		c.finish()
	}
}

// passedOnOld reports whether a check among calls passed on a view of
// ts the table did not give during this batch, where other replicas may
// have written since (they were seen to lately, or this replica has no
// leases to tell). A gateway that charges after the response forwards a
// request on a check that passes: passed on a refilled view while others
// charged the bucket into debt, checks would let requests through
// without bound. A check denied on such a view stands (others only take
// tokens), and one on a bucket this replica alone writes is exact.
func (b *Backend) passedOnOld(ts []target, calls []*call) bool {
	passed := false
	for _, c := range calls {
		passed = passed || (c.kind == decide && c.allowed && c.req.Hits == 0 && !c.req.Refund)
	}
	if !passed {
		return false
	}
	for i := range ts {
		if !ts[i].fresh && (ts[i].shared || b.leases == nil) {
			return true
		}
	}
	return false
}

// decideCalls plans every target at now and decides the calls in order,
// each over all the targets' limits together (a cascade passes only if
// every bucket has the tokens) and against the states the calls before
// it left. write reports that some call takes or gives back tokens;
// needView, that some call was denied or only checked, an answer that
// is only as good as the state it was read from.
func decideCalls(ts []target, calls []*call, now int64) (write, needView bool) {
	var states []bucket.State
	var limits []bucket.Limit
	refund := false
	for _, c := range calls {
		refund = refund || c.req.Refund
	}
	for i := range ts {
		ts[i].refund = refund
		ts[i].plan(now)
		limits = append(limits, ts[i].res.Limits...)
		states = append(states, ts[i].pool(now)...)
	}
	charged, admitted := false, false
	var forgiven, before []int64
	for _, c := range calls {
		if c.kind != decide {
			continue
		}
		charge := c.req.Charge && !c.req.Refund
		if charge {
			before = before[:0]
			for k, l := range limits {
				before = append(before, bucket.Refill(l, states[k], now).Tokens)
			}
		}
		c.results, c.allowed = backend.Apply(c.req, limits, states, now)
		c.limits = limits
		if charge {
			// What a limit's floor cut off the charge still counts as
			// consumed, though it never left the bucket.
			if forgiven == nil {
				forgiven = make([]int64, len(limits))
			}
			for k := range limits {
				forgiven[k] += c.results[k].Cost - (before[k] - states[k].Tokens)
			}
		}
		switch {
		case c.req.Hits > 0 && charge:
			write, charged = true, true
		case c.allowed && c.req.Hits > 0:
			write, admitted = true, admitted || !c.req.Refund
		default:
			needView = true
		}
	}
	off := 0
	for i := range ts {
		n := len(ts[i].res.Limits)
		ts[i].states = states[off : off+n]
		ts[i].charged, ts[i].admitted = charged, admitted
		ts[i].forgiven = nil
		if forgiven != nil {
			ts[i].forgiven = forgiven[off : off+n]
		}
		off += n
	}
	return write, needView
}

// plan chooses how t will be written and the states its decision starts
// from.
func (t *target) plan(now int64) {
	it := t.item
	limits := t.res.Limits
	t.base = make([]bucket.State, len(limits))
	switch {
	case it == nil || (it.Expired(now) && (t.fresh || !t.shared)):
		// Gone, as the table just said or as far as this replica can
		// tell. A stale copy of a shared item falls through: the write's
		// condition (not expired) finds out, and a lost race returns
		// the item as it is.
		t.mode = create
		if it == nil && t.seenAt == 0 && !t.fresh && !anyBudget(limits) {
			// Not for a budget: no span of time says whether an item
			// another replica wrote is full (bucket.FillTime).
			t.mode = unseen
		}
		for i, l := range limits {
			t.base[i] = bucket.Full(l, now)
		}
	case it.cfg != t.fp && it == t.overGuess:
		// Created by a wrong guess of its limits and untouched since: no
		// answer it gave stands, and its lease is folded into this write,
		// so it is a new bucket under the right limits, full, as the
		// key's first call finds it. Reconciled instead, it would keep
		// the guessed burst (a limit of 20 where the entity has 100),
		// under-admitting far more than the guess took. Its consumed
		// totals stay: those tokens did leave it.
		t.mode = rewrite
		for i, l := range limits {
			t.base[i] = bucket.Full(l, now)
			if s, ok := it.StateOf(l.Name); ok {
				t.base[i].Consumed = s.Consumed
			}
		}
	case it.cfg != t.fp || it.legacy:
		// Other limits, or an item without the attributes of its leases
		// (written before they were kept): rewritten whole.
		t.mode = rewrite
		copy(t.base, bucket.Reconcile(it.limits, it.states, limits, now))
	default:
		t.mode = incremental
		for i, l := range limits {
			s, ok := it.StateOf(l.Name)
			if !ok {
				// Same fingerprint, missing attribute: a damaged item;
				// rebuild it rather than fail forever (pitfall 3).
				t.mode = rewrite
				s = bucket.Full(l, now)
			}
			t.base[i] = s
			if l.IsBudget() && s.Clock < bucket.PeriodStart(l, now) {
				// A new period: the budget is given again and its
				// leases dropped, which only a whole item says. The
				// rewrite is conditioned on the item as seen, so of
				// the replicas that cross the boundary together one
				// starts the period and the others decide on it.
				t.mode = rewrite
			}
		}
	}
}

// anyBudget reports whether some limit of limits is a budget.
func anyBudget(limits []bucket.Limit) bool {
	for _, l := range limits {
		if l.IsBudget() {
			return true
		}
	}
	return false
}

// pool is what t's decision may spend from, per limit: the bucket as
// planned, refilled to now, the report on this replica's lease taken in
// (bucket.Return: what the lease folds comes back, covered by its window,
// never above the room, and a bucket that has stood at its room since
// the lease's first spend is credited the refill that stood still), and
// then its expired lease windows freed. The refill comes first even for
// a batch that decides nothing (a renewal): settle counts what the write
// takes against the refilled bucket, so a grant sized on a state without
// its refill would take that refill too and credit it nowhere.
func (t *target) pool(now int64) []bucket.State {
	states := slices.Clone(t.base)
	n := len(t.res.Limits)
	t.freed = make([][bucket.LeaseSlots]bool, n)
	if t.reporting {
		t.kept = make([]int64, n)
	}
	t.credit, t.lostBack, t.since = make([]int64, n), make([]int64, n), make([]int64, n)
	for j, l := range t.res.Limits {
		s := bucket.Refill(l, states[j], now)
		if s.AtRoomSince != 0 && t.base[j].AtRoomSince == 0 && (t.lostRace || t.base[j].Tokens >= bucket.Room(l, t.base[j])) {
			// At its room, and the item does not say since when
			// (fieldAtRoom, which every write that leaves it there
			// sets): from this write on.
			s.AtRoomSince = now
		}
		t.since[j] = s.AtRoomSince
		if t.reporting {
			// The replica's own report first: a lease stops being spent
			// when it expires, so what it holds then is unspent, and
			// comes back while its window is still in the item.
			rep := bucket.Report{Window: t.rep.Window, Out: at(t.rep.Out, j), Back: at(t.lease, j), Keep: at(t.keep, j)}
			plain, ok := bucket.Return(l, s, rep, now)
			if ok {
				rep.First = t.rep.First
				s, _ = bucket.Return(l, s, rep, now)
				t.kept[j], t.credit[j] = rep.Keep, s.Tokens-plain.Tokens
			} else {
				// Its window was freed: what the lease held is no longer
				// covered, and comes back to nobody.
				t.lostBack[j] = rep.Back
			}
		}
		if t.leaseW > 0 {
			// After the refill: the room a freed window makes is
			// refilled from now on.
			before := s.Out
			s, _ = bucket.Expire(s, t.leaseW, now)
			for k := range before {
				t.freed[j][k] = before[k].Window != 0 && s.Out[k].Window == 0
			}
		}
		states[j] = s
	}
	return states
}
