package backend

import (
	"slices"

	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/lease"
)

// quickTau is the memory (ms) of holding.quick.
const quickTau = 1000

// unmetWindow is the shortest time (ms) holding.unmet is read over as a
// rate: calls arriving within a few ms of each other are a storm's
// pace, a single call is not.
const unmetWindow = 10

// Asks returns what each of b's limits' next grant is sized from at now
// (all but what the bucket holds): this replica's demand as it arrives,
// the greater of the horizon's and what it was asked over the last
// second (quick, read over at least a round trip of rtt ms), so that a
// spike is met at its pace; the fleet's, after reading the consumed
// totals of view (the bucket as the decision in hand sees it; nil:
// unknown); what the lease holds; and the last grant when it went faster
// than planned. nil: grant nothing.
func (ls *Leases[K]) Asks(b *LeaseBucket[K], view BucketView, now, rtt int64) []lease.Ask {
	h := ls.lockLive(b.Key)
	defer h.mu.Unlock()
	if !h.matches(b.Res, b.FP) {
		if h.held() > 0 {
			// Tokens under other limits wait for a decision that folds
			// them; meanwhile this one grants nothing.
			return nil
		}
		h.align(b.Res, b.FP)
	}
	if now >= bucket.LeaseEndOf(b.Res.Limits, now) {
		// The last moments of a budget's period: a lease would end
		// before it could be spent (bucket.LeaseEnd).
		return nil
	}
	tau, window := ls.Horizon(), ls.policy.WindowMs()
	fast := h.grantedAt > 0 && now-h.grantedAt < tau/2
	asks := make([]lease.Ask, len(h.own))
	for i, l := range b.Res.Limits {
		if view != nil && view.Config() == b.FP {
			if s, ok := view.StateOf(l.Name); ok {
				h.fleet[i].Observe(s.Consumed, now, tau)
			}
		}
		own := ls.ownRate(h, i, now, rtt)
		if h.dryAt > 0 {
			own = max(own, float64(h.unmet[i])/float64(max(now-h.dryAt, unmetWindow)))
		}
		asks[i] = lease.Ask{Own: own, Fleet: h.fleet[i].Arriving(now, tau, window), Held: h.tokens[i], RTT: rtt}
		if fast {
			asks[i].Grow = h.granted[i]
		}
	}
	return asks
}

// ownRate is what h's replica is asked of limit j at now (millitokens
// per ms): the greater of the horizon's demand and what it was asked
// over the last second (quick, read over at least a round trip of rtt
// ms), so that a spike is met at its pace. h locked.
func (ls *Leases[K]) ownRate(h *holding, j int, now, rtt int64) float64 {
	return max(h.own[j].Arriving(now, ls.Horizon(), ls.policy.WindowMs()), h.quick[j].Arriving(now, quickTau, max(rtt, 10)))
}

// Spend pays a call of hits from this replica's leases on every bucket of
// bs, when each holds what the call costs under the limits it resolved
// to now and has not expired: no call to the store, no wait. It returns
// each limit's result, bs's limits one after the other, and reports
// whether the leases paid. A result's tokens are the bucket as this
// replica's last write left it, refilled to now, plus what the lease
// holds after paying (at most the burst less the cost): exact with one
// replica, an estimate with several, whose writes it has not seen.
// renew lists the buckets whose lease is left at half its last grant or
// less, or would not last three round trips of rtt ms: marked busy, for
// the caller to renew in the background.
//
// A call arriving (not one handed back from a batch) counts as this
// replica's demand whether the lease pays it or not: demand is what is
// asked, so that a replica whose lease runs dry at the limit still sees
// how much more it is asked than it gets. bs holds one bucket, or two
// (a cascade), locked in the order of NewLeases' less.
func (ls *Leases[K]) Spend(bs []LeaseBucket[K], hits uint64, now, rtt int64, arriving bool) (results []bucket.Result, renew []LeaseBucket[K], paid bool) {
	mode := handedBack
	if arriving {
		mode = arrivingCall
	}
	results, renew, paid, _ = ls.spend(bs, hits, now, rtt, mode)
	return results, renew, paid
}

// beyondReachTries bounds how often Beyond starts a renewal and tries the
// leases again: each try after the first follows a grant that landed and
// was spent by other calls before this one could pay.
const beyondReachTries = 3

// Beyond answers from the leases of bs a call of hits that cannot wait
// for the store (its deadline is nearer than a round trip; its demand was
// counted on arrival). Each try first has renew start a renewal of any
// lease with none under way, then, under the leases' locks, either pays
// the call (as Spend) or marks the leases dry and reports outrun: a lease
// spent with its next grant on the way, which is all this replica may
// admit until it lands (Outrun). Taken under one lock, a grant cannot
// land between the two and leave the call neither paid nor outrun.
func (ls *Leases[K]) Beyond(bs []LeaseBucket[K], hits uint64, now, rtt int64, renew func()) (results []bucket.Result, low []LeaseBucket[K], paid, outrun bool) {
	for range beyondReachTries {
		renew()
		if results, low, paid, outrun = ls.spend(bs, hits, now, rtt, beyondReach); paid || outrun {
			return results, low, paid, outrun
		}
	}
	return nil, nil, false, false
}

// AtLimit answers from the leases of bs a call of hits their leases
// could not pay (its demand was counted on arrival), when this replica's
// last write left some bucket of bs drained (Drained): it first has renew
// start a renewal of any lease with none under way, then, under the
// leases' locks, either pays the call (a grant landed meanwhile) or
// reports denied while that renewal is on its way. Near the limit the
// lease is all this replica may admit until the grant lands, as a quota
// client's assignment is; a call that waited for the store instead would
// queue behind the write in flight and the one after it, for tokens
// those writes take anyway, and a replica whose every admission waits
// for a write of its own races the others' for each token. The refill
// is not lost: the renewal claims it for the calls after this one.
// renew is called only on a bucket other replicas write too (their
// writes were seen lately), or on a region's part of a global limit
// (Resolved.Regional): a replica alone on any other bucket has nobody
// to race, and its call is decided by the store exactly, as one bucket
// would. A region's part is not one bucket's answer to begin with (the
// regions share the limit, and the part moves with their demand), and
// a lone replica there that queued each call at the limit for a write
// put one to two round trips on it.
// Neither (not drained, or no renewal under way): the call is for the
// store, so that a bucket with tokens to spare is decided as one bucket
// would.
func (ls *Leases[K]) AtLimit(bs []LeaseBucket[K], hits uint64, now, rtt int64, renew func()) (results []bucket.Result, low []LeaseBucket[K], paid, denied bool) {
	if !ls.Drained(bs, now, rtt, 0) && !ls.heldDrained(bs, now) {
		return nil, nil, false, false
	}
	if renew != nil && (ls.shared(bs, now) || regional(bs)) {
		renew()
	}
	return ls.spend(bs, hits, now, rtt, atLimit)
}

// heldDrained reports whether some bucket of bs is held drained while
// its renewal is on its way (holding.drainedRenewing), however long ago
// its view was written.
func (ls *Leases[K]) heldDrained(bs []LeaseBucket[K], now int64) bool {
	for i := range bs {
		h := ls.get(bs[i].Key)
		if h == nil {
			continue
		}
		h.mu.Lock()
		held := h.stillDrained(now)
		h.mu.Unlock()
		if held {
			return true
		}
	}
	return false
}

// regional reports whether some bucket of bs holds a region's part of a
// global limit (Resolved.Regional).
func regional[K comparable](bs []LeaseBucket[K]) bool {
	for i := range bs {
		if bs[i].Res.Regional {
			return true
		}
	}
	return false
}

// shared reports whether this replica's writes on some bucket of bs found
// another writer within two horizons before now (how long a lease's
// bookkeeping is remembered).
func (ls *Leases[K]) shared(bs []LeaseBucket[K], now int64) bool {
	for i := range bs {
		if ls.SharedSince(bs[i].Key, now-2*ls.Horizon()) {
			return true
		}
	}
	return false
}

// lockOrder is the order in which bs's holdings are locked (NewLeases'
// less), so that two cascades over the same pair cannot deadlock.
func (ls *Leases[K]) lockOrder(bs []LeaseBucket[K]) []int {
	if len(bs) == 2 && ls.less(bs[1].Key, bs[0].Key) {
		return []int{1, 0}
	}
	if len(bs) == 2 {
		return []int{0, 1}
	}
	return []int{0}
}

// lockAll finds the holdings of bs (adding those missing when add is
// set) and locks them in order; ok is false, with nothing locked, when
// some bucket has none. A holding Due forgot meanwhile would keep what
// the caller records, and its next grant, where nobody finds them: it is
// looked up again.
func (ls *Leases[K]) lockAll(bs []LeaseBucket[K], order []int, add bool) (hs [2]*holding, unlock func(), ok bool) {
	for live := false; !live; {
		for i := range bs {
			if add {
				hs[i] = ls.getOrAdd(bs[i].Key)
			} else if hs[i] = ls.get(bs[i].Key); hs[i] == nil {
				return hs, nil, false
			}
		}
		for _, i := range order {
			hs[i].mu.Lock()
		}
		live = !hs[0].gone && (len(bs) == 1 || !hs[1].gone)
		if !live {
			for _, i := range order {
				hs[i].mu.Unlock()
			}
		}
	}
	return hs, func() {
		for _, i := range order {
			hs[i].mu.Unlock()
		}
	}, true
}

// drain takes from the leases of bs what they hold toward a charge of
// hits (backend.Request.Charge) that they could not pay whole (Spend
// counted its demand): per limit of bs in order, the tokens taken, each
// at most the charge's cost (nil when no lease holds any). The caller
// charges the store the rest. A charge sent to the store whole would
// leave a replica's lease to admit checks, which cost nothing, for as
// long as the lease lasts, however deep the shared bucket is in debt.
func (ls *Leases[K]) drain(bs []LeaseBucket[K], hits uint64, now int64) []int64 {
	hs, unlock, ok := ls.lockAll(bs, ls.lockOrder(bs), false)
	if !ok {
		return nil
	}
	defer unlock()
	var paid []int64
	total := 0
	for i := range bs {
		total += len(bs[i].Res.Limits)
	}
	off := 0
	for i := range bs {
		h, b := hs[i], &bs[i]
		n := len(b.Res.Limits)
		if h.matches(b.Res, b.FP) && now < h.expires {
			for j, l := range b.Res.Limits {
				take := min(max(h.tokens[j], 0), bucket.Cost(l, hits))
				if take == 0 {
					continue
				}
				if paid == nil {
					paid = make([]int64, total)
				}
				h.tokens[j] -= take
				paid[off+j] = take
				ls.stats.LeaseOutstanding.Add(-take)
			}
			h.used = max(h.used, now)
		}
		off += n
	}
	return paid
}

// Charging is req, a charge the leases of bs could not pay whole, with
// what they held taken into it (drain) and set as its Paid: the request
// for the store, which charges the rest. It is req itself when they held
// nothing, and a copy otherwise (the caller's req is left as it was).
func (ls *Leases[K]) Charging(bs []LeaseBucket[K], req *Request, now int64) *Request {
	paid := ls.drain(bs, req.Hits, now)
	if paid == nil {
		return req
	}
	rq := *req
	rq.Paid = paid
	return &rq
}

// spendMode says who asks the leases to pay.
type spendMode int

const (
	// arrivingCall: a call just come, whose demand counts.
	arrivingCall spendMode = iota
	// handedBack: a call handed back from a batch; a lease that cannot
	// pay it is not marked dry (the batch's write decides it).
	handedBack
	// beyondReach: a call that cannot wait for the store (Beyond).
	beyondReach
	// atLimit: a call on a drained bucket (AtLimit).
	atLimit
)

func (ls *Leases[K]) spend(bs []LeaseBucket[K], hits uint64, now, rtt int64, mode spendMode) (results []bucket.Result, renew []LeaseBucket[K], paid, outrun bool) {
	arriving := mode == arrivingCall
	tau, window := ls.Horizon(), ls.policy.WindowMs()
	order := ls.lockOrder(bs)
	hs, unlock, ok := ls.lockAll(bs, order, arriving)
	if !ok {
		return nil, nil, false, false
	}
	defer unlock()
	if arriving {
		for i := range bs {
			h := hs[i]
			if !h.matches(bs[i].Res, bs[i].FP) {
				if h.held() > 0 {
					continue // tokens under other limits: wait for a fold
				}
				h.align(bs[i].Res, bs[i].FP)
			}
			for j, l := range bs[i].Res.Limits {
				c := bucket.Cost(l, hits)
				h.own[j].Add(c, now, tau)
				h.quick[j].Add(c, now, quickTau)
			}
			h.used = max(h.used, now)
		}
	}
	for i := range bs {
		h := hs[i]
		ok := h.matches(bs[i].Res, bs[i].FP) && now < h.expires
		for j, l := range bs[i].Res.Limits {
			ok = ok && h.tokens[j] >= max(bucket.Cost(l, hits), 1) // a check too needs a token: at zero a limit denies it
		}
		ok = ok && !h.inDebt(bs[i].Res, bs[i].FP, now)
		if !ok {
			switch mode {
			case arrivingCall:
				unmet(hs[:len(bs)], bs, hits, now)
			case beyondReach:
				unmet(hs[:len(bs)], bs, 0, now)
				for k := range bs {
					outrun = outrun || hs[k].outrun(bs[k].Res, bs[k].FP, now)
				}
			case atLimit:
				unmet(hs[:len(bs)], bs, 0, now)
				for k := range bs {
					outrun = outrun || hs[k].drainedRenewing(bs[k].Res, bs[k].FP, now, drainedRTTs*rtt)
				}
			}
			return nil, nil, false, outrun
		}
	}
	for i := range bs {
		h, b := hs[i], &bs[i]
		var spent int64
		if h.first == 0 {
			h.first = now
		}
		for j, l := range b.Res.Limits {
			c := bucket.Cost(l, hits)
			h.tokens[j] -= c
			spent += c
			view := bucket.State{Clock: now}
			if v := h.view; v != nil && !v.Expired(now) && v.Config() == b.FP {
				if s, ok := v.StateOf(l.Name); ok {
					view = bucket.Refill(l, s, now)
					if !h.reporting && h.win != 0 && j < len(h.out) {
						// As the report of what the lease spent would
						// leave it: refill that stood still at the room
						// those tokens kept comes back (bucket.Return).
						rep := bucket.Report{Window: h.win, Out: h.out[j], Keep: h.tokens[j], First: h.first}
						if x, ok := bucket.Return(l, view, rep, now); ok {
							view = x
						}
					}
				}
			}
			// At most the burst less this cost, as one bucket would
			// hold after paying it: a bucket that refilled to full while
			// the lease was out holds the burst, and the lease's tokens
			// come on top of it only until they are spent.
			view.Tokens = min(view.Tokens+h.tokens[j], l.Burst-c)
			results = append(results, bucket.Result{Cost: c, Tokens: view.Tokens, Allowed: true,
				Wait: bucket.Wait(l, view, l.Burst, now)})
		}
		h.used = now
		ls.stats.LeaseOutstanding.Add(-spent)
		if h.busy {
			continue
		}
		due := h.viewStale(b.FP, now, rtt, tau)
		for j := range h.tokens {
			due = due || lease.Renew(h.tokens[j], h.granted[j], h.own[j].Arriving(now, tau, window), rtt)
		}
		if due {
			h.busy, h.renewing = true, true
			renew = append(renew, LeaseBucket[K]{Key: b.Key, Res: b.Res, FP: b.FP})
		}
	}
	return results, renew, true, false
}

// unmet records what a call of hits asks of the leases hs (locked, lined
// up with bs) that could not pay it all.
func unmet[K comparable](hs []*holding, bs []LeaseBucket[K], hits uint64, now int64) {
	for i, h := range hs {
		if !h.matches(bs[i].Res, bs[i].FP) {
			continue
		}
		if h.dryAt == 0 {
			h.dryAt = now
		}
		for j, l := range bs[i].Res.Limits {
			h.unmet[j] += bucket.Cost(l, hits)
		}
	}
}

// seen returns the bucket view b's lease last recorded, nil if none or
// not under b's limits, or expired at now.
func (ls *Leases[K]) seen(b *LeaseBucket[K], now int64) BucketView {
	h := ls.get(b.Key)
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if v := h.view; v != nil && v.Config() == b.FP && !v.Expired(now) {
		return v
	}
	return nil
}

// Wants returns the grant a write on b that pays costs (per limit of b)
// should ask for each limit, sized by the policy from the bucket as this
// replica last saw it, refilled to now, less the costs; the whole burst
// when it has not seen it (the store grants no more than it holds). It
// is for a store that decides and grants in one atomic step, such as a
// script, where the bucket's state is known only to the store.
func (ls *Leases[K]) Wants(b *LeaseBucket[K], costs []int64, now, rtt int64) []int64 {
	view := ls.seen(b, now)
	asks := ls.Asks(b, view, now, rtt)
	if asks == nil {
		return nil
	}
	out := make([]int64, len(asks))
	for j, l := range b.Res.Limits {
		a := asks[j]
		a.Avail = l.Burst
		if view != nil {
			if s, ok := view.StateOf(l.Name); ok {
				a.Avail = bucket.Refill(l, s, now).Tokens
			}
		}
		if j < len(costs) {
			a.Avail -= costs[j]
		}
		out[j] = ls.policy.Size(l, a)
	}
	return out
}

// Short reports whether, for some limit of bs, the lease this replica
// could get from the bucket as it last saw it (refilled to now) would
// last less than a round trip of rtt ms at its demand
// (lease.Policy.Short): a bucket at or near its limit, as far as a
// replica that waits a round trip for every answer can tell. False for a
// bucket it has not seen, or with no round trip known.
func (ls *Leases[K]) Short(bs []LeaseBucket[K], now, rtt int64) bool {
	if rtt <= 0 {
		return false
	}
	for i := range bs {
		b := &bs[i]
		view := ls.seen(b, now)
		if view == nil {
			continue
		}
		asks := ls.Asks(b, view, now, rtt)
		for j, l := range b.Res.Limits {
			s, ok := view.StateOf(l.Name)
			if !ok || asks == nil {
				continue
			}
			a := asks[j]
			a.Avail = bucket.Refill(l, s, now).Tokens
			if ls.policy.Short(l, a) {
				return true
			}
		}
	}
	return false
}

// DenyFromView decides a call of hits that the leases of bs could not
// pay from what this replica last saw of each bucket (recorded at most
// maxAge ms ago), refilled to now, with what its lease holds on top:
// when that cannot pay the call, it reports the denial's results, with
// no call to the store. Other writers only take tokens from a bucket, so
// such a denial stands unless tokens came back meanwhile (a return, a
// refund, a raised limit), which maxAge bounds. It reports false when
// some bucket's view is absent, older or under other limits, or the
// call could be paid.
func (ls *Leases[K]) DenyFromView(bs []LeaseBucket[K], hits uint64, now, maxAge int64) ([]bucket.Result, bool) {
	var limits []bucket.Limit
	var states []bucket.State
	for i := range bs {
		b := &bs[i]
		h := ls.get(b.Key)
		if h == nil {
			return nil, false
		}
		h.mu.Lock()
		v, at := h.view, h.viewAt
		var held []int64
		if h.matches(b.Res, b.FP) {
			held = slices.Clone(h.tokens)
		}
		h.mu.Unlock()
		if v == nil || now-at > maxAge || v.Config() != b.FP || v.Expired(now) {
			return nil, false
		}
		for j, l := range b.Res.Limits {
			s, ok := v.StateOf(l.Name)
			if !ok {
				return nil, false
			}
			s = bucket.Refill(l, s, now)
			if j < len(held) {
				s.Tokens = min(s.Tokens+held[j], l.Burst)
			}
			limits = append(limits, l)
			states = append(states, s)
		}
	}
	results := make([]bucket.Result, len(limits))
	if bucket.Decide(limits, states, hits, now, results) {
		return nil, false
	}
	return results, true
}

// SeenWithin reports whether this replica recorded every bucket of bs, as
// a write left it, at most maxAge ms before now: recently enough to deny
// from (other writers only take tokens). A store that stopped answering
// leaves its buckets unseen, and its calls to the failure policy.
func (ls *Leases[K]) SeenWithin(bs []LeaseBucket[K], now, maxAge int64) bool {
	for i := range bs {
		h := ls.get(bs[i].Key)
		if h == nil {
			return false
		}
		h.mu.Lock()
		ok := h.view != nil && now-h.viewAt <= maxAge
		h.mu.Unlock()
		if !ok {
			return false
		}
	}
	return true
}
