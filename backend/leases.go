package backend

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/lease"
)

// Leases are the tokens one replica has taken out of its store's shared
// buckets to spend from memory (DESIGN section 11), and what it knows of
// the demand on each: the bookkeeping every backend with leases shares.
// A backend owns one operation on them: moving tokens out of a bucket
// into a lease (and back) with the same atomic write a decision makes, so
// that the fleet never admits a token that has not left the shared
// bucket. Everything else (when to renew, how much to ask, who pays from
// the lease, which call a dry lease denies) is decided here, from memory
// and the clock the backend passes in.
//
// A lease is topped up by a renewal in the background once half of its
// last grant is spent or it would last less than three round trips
// (lease.Renew), so steady traffic never waits; it goes back to its
// bucket when the key has been idle for a horizon, when it expires (two
// horizons after its last grant), when its bucket's limits change, and on
// Close. A decision its lease cannot pay folds what is left of the lease
// back into its own write: the lease is then spent or returned with that
// write.
//
// Everything a lease holds is guarded by its own mutex; Leases' mutex
// guards only the map. No lock is held across a call to the store. K is
// the backend's bucket key.
type Leases[K comparable] struct {
	policy lease.Policy
	stats  *LeaseStats
	less   func(a, b K) bool

	mu sync.Mutex
	m  map[K]*holding
}

// LeaseStats are the running totals of a replica's leases, in
// millitokens: Leased and Returned moved into leases and back into
// buckets, LeaseDropped lost on the way (a write whose outcome is
// unknown, a limit removed), LeaseCut given back to a bucket that,
// refilled while they were out, could not hold them (the burst cuts them
// as it cuts refill into a full bucket: no admission is lost to them,
// but the bucket's consumed total counts them), LeaseOutstanding held
// now. LeaseWrites
// counts the writes that granted or gave back lease tokens (the backend
// adds to it), DeadlineDenials the decisions denied without the store's
// answer (DeadlineDenial).
type LeaseStats struct {
	Leased, Returned, LeaseDropped, LeaseCut atomic.Uint64
	LeaseOutstanding                         atomic.Int64
	LeaseWrites                              atomic.Uint64
	DeadlineDenials                          atomic.Uint64
}

// LeaseBucket is a bucket as a decision on it resolved: its key, its
// limits and their fingerprint. A lease holds tokens under one set of
// limits; a decision under others does not spend them.
type LeaseBucket[K comparable] struct {
	Key K
	Res Resolved
	FP  string
}

// BucketView is a bucket as this replica's last write (or read) left it,
// which answers from a lease report from. It is never modified once
// seen.
type BucketView interface {
	// StateOf returns the state of the limit called name.
	StateOf(name string) (bucket.State, bool)
	// Expired reports whether the bucket's TTL had passed at now (ms):
	// it then counts as absent.
	Expired(now int64) bool
	// Config is the fingerprint of the limits it was written under.
	Config() string
}

// holding is this replica's lease on one bucket. It lives in Leases.m
// from its first grant until it has been empty and unused for two
// horizons.
type holding struct {
	mu sync.Mutex
	// fp is the fingerprint of the limits the tokens were taken under,
	// and res their resolution (for the TTL of a renewal's write). A
	// decision under other limits does not spend them: it folds them
	// back into its write.
	fp     string
	res    Resolved
	tokens []int64 // millitokens held, per res.Limits
	// granted is the size of the last grant, per limit: a lease down to
	// half of it is renewed.
	granted []int64
	// grantedAt is when (ms) the last grant came: a lease renewed within
	// half a horizon of it went faster than planned, and grows.
	grantedAt int64
	// view is the bucket as this replica's last write left it, set
	// with the tokens under mu, so that a decision paid from the lease
	// reads the bucket and the lease of one moment. nil: none.
	view   BucketView
	viewAt int64        // ms: when view was recorded
	own    []lease.Rate // this replica's spending, per limit
	// quick is the same demand over about a second (quickTau): what the
	// replica is asked right now, before the horizon's average has caught
	// up with a spike.
	quick []lease.Rate
	// unmet is what the calls that found the lease unable to pay them
	// asked since dryAt (ms), when that first happened after its last
	// grant (0: the lease has paid every call since): the need of the
	// calls waiting for the next grant, which the quick average reads
	// too slowly when a storm begins.
	unmet   []int64
	dryAt   int64
	fleet   []lease.Counter // the fleet's taking (consumed totals), per limit
	expires int64           // ms: from then on the tokens are only returned
	used    int64           // ms: the last spend or grant
	// othersAt is when (ms) a write of this replica last found that
	// another writer had taken tokens from the bucket since the state the
	// write started from: the bucket is shared, and kept alive by others.
	othersAt int64
	// busy: a renewal or return of this lease is under way; no second
	// one starts. renewing: it is a renewal (a grant is on its way).
	busy, renewing bool
	// heldDrained: a call found view drained while this renewal was on
	// its way (AtLimit), and the view then was the one at heldView (ms).
	heldDrained bool
	heldView    int64
	// out is what the store counts out for this lease, per res.Limits,
	// in expiry window win (0: nothing; leasereport.go); reporting: a
	// write carries that report, and no other may.
	out       []int64
	win       int64
	reporting bool
	// first is when the lease first paid a call since its last report
	// was taken (0: it has not): the store may owe the room its spending
	// made the refill that stood still since (bucket.Report.First).
	first int64
	// chargedAt is when (ms) a charge last came to this replica on the
	// bucket (Charged; 0: none): its view is then kept fresh, since
	// another replica's charges may put it in debt (viewStale).
	chargedAt int64
	// gone: Due forgot it (empty and unused for two horizons) after a
	// caller found it in the map and before that caller locked it.
	// Nothing is put into a gone holding: it would be stranded there.
	gone bool
}

// NewLeases returns an empty set of leases sized by p, counting into
// stats. less orders keys, for a decision on two buckets to lock their
// leases in one order whichever comes first.
func NewLeases[K comparable](p lease.Policy, stats *LeaseStats, less func(a, b K) bool) *Leases[K] {
	return &Leases[K]{policy: p, stats: stats, less: less, m: map[K]*holding{}}
}

// Known reports whether the leases keep anything of k: tokens, or the
// bookkeeping of a lease spent or given back within two horizons.
func (ls *Leases[K]) Known(k K) bool { return ls.get(k) != nil }

// Policy is the policy the leases are sized by.
func (ls *Leases[K]) Policy() lease.Policy { return ls.policy }

// Horizon is the policy's horizon in ms; a lease is idle after it and
// expired after two.
func (ls *Leases[K]) Horizon() int64 { return ls.policy.Horizon }

func (ls *Leases[K]) get(k K) *holding {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.m[k]
}

func (ls *Leases[K]) getOrAdd(k K) *holding {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	h := ls.m[k]
	if h == nil {
		h = &holding{}
		ls.m[k] = h
	}
	return h
}

// lockLive returns k's holding locked, a new one when there is none or
// the one found was forgotten by Due before it could be locked.
func (ls *Leases[K]) lockLive(k K) *holding {
	for {
		h := ls.getOrAdd(k)
		h.mu.Lock()
		if !h.gone {
			return h
		}
		h.mu.Unlock()
	}
}

// matches reports whether h's tokens line up with limits of fingerprint
// fp: the same limits in the same order.
func (h *holding) matches(res Resolved, fp string) bool {
	if h.fp != fp || len(h.res.Limits) != len(res.Limits) {
		return false
	}
	for i, l := range h.res.Limits {
		if res.Limits[i].Name != l.Name {
			return false
		}
	}
	return true
}

// align makes h hold the limits of res (fingerprint fp), keeping the
// demand estimates of the limits that stay by name. Its tokens must have
// been taken out first: tokens never move between limits.
func (h *holding) align(res Resolved, fp string) {
	n := len(res.Limits)
	own, quick, fleet := make([]lease.Rate, n), make([]lease.Rate, n), make([]lease.Counter, n)
	for i, l := range res.Limits {
		if j := slices.IndexFunc(h.res.Limits, func(o bucket.Limit) bool { return o.Name == l.Name }); j >= 0 && j < len(h.own) {
			own[i], quick[i], fleet[i] = h.own[j], h.quick[j], h.fleet[j]
		}
	}
	if h.win != 0 {
		out := make([]int64, n)
		for j, l := range h.res.Limits {
			if i := slices.IndexFunc(res.Limits, func(o bucket.Limit) bool { return o.Name == l.Name }); i >= 0 && j < len(h.out) {
				out[i] = h.out[j]
			}
		}
		h.out = out
	}
	h.fp, h.res, h.own, h.quick, h.fleet = fp, res, own, quick, fleet
	h.unmet, h.dryAt = make([]int64, n), 0
	h.tokens, h.granted = make([]int64, n), make([]int64, n)
}

func (h *holding) held() int64 {
	var sum int64
	for _, v := range h.tokens {
		sum += v
	}
	return sum
}

// refilled marks h's lease able to pay again: no call waits on it.
func (h *holding) refilled() {
	h.dryAt = 0
	clear(h.unmet)
}

// hold returns b's holding locked and lined up with b's limits, or nil
// (nothing locked) when it holds tokens under other limits, which wait
// for a decision that folds them.
func (ls *Leases[K]) hold(b *LeaseBucket[K]) *holding {
	h := ls.lockLive(b.Key)
	if !h.matches(b.Res, b.FP) {
		if h.held() > 0 {
			h.mu.Unlock()
			return nil
		}
		h.align(b.Res, b.FP)
	}
	return h
}

// take empties h into a slice lined up with res's limits: what the lease
// holds of each limit by name. Tokens of a limit res no longer has are
// gone with it (counted as dropped). It returns nil when h holds nothing.
func (ls *Leases[K]) take(h *holding, res Resolved) []int64 {
	if h.held() == 0 {
		return nil
	}
	out := make([]int64, len(res.Limits))
	var kept, all int64
	for j, l := range h.res.Limits {
		all += h.tokens[j]
		if i := slices.IndexFunc(res.Limits, func(o bucket.Limit) bool { return o.Name == l.Name }); i >= 0 {
			out[i] = h.tokens[j]
			kept += out[i]
		}
		h.tokens[j] = 0
	}
	ls.stats.LeaseOutstanding.Add(-all)
	ls.stats.LeaseDropped.Add(uint64(all - kept))
	return out
}

// Withdraw takes every token of b's lease out, lined up with b's limits,
// for a decision that folds them into its write; nil when it holds none.
func (ls *Leases[K]) Withdraw(b *LeaseBucket[K]) []int64 {
	h := ls.get(b.Key)
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return ls.take(h, b.Res)
}

// Peek returns a copy of what b's lease holds, for a denial decided from
// the last seen bucket and the lease together; nothing is taken. nil when
// it holds nothing under b's limits.
func (ls *Leases[K]) Peek(b *LeaseBucket[K]) []int64 {
	h := ls.get(b.Key)
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.matches(b.Res, b.FP) || h.held() == 0 {
		return nil
	}
	return slices.Clone(h.tokens)
}

// Restore puts back tokens a decision withdrew from b's lease and could
// not write: only after a write that certainly did not happen (every
// attempt lost its race), never after one whose outcome is unknown,
// which might have returned the tokens to the bucket already.
func (ls *Leases[K]) Restore(b *LeaseBucket[K], tokens []int64) {
	if tokens == nil {
		return
	}
	h := ls.lockLive(b.Key)
	defer h.mu.Unlock()
	if !h.matches(b.Res, b.FP) {
		if h.held() > 0 {
			ls.Drop(tokens)
			return
		}
		h.align(b.Res, b.FP)
	}
	var sum int64
	for i, v := range tokens {
		h.tokens[i] += v
		sum += v
	}
	ls.stats.LeaseOutstanding.Add(sum)
}

// Drop forgets tokens a decision withdrew and could not write: the
// bucket is short of them until it refills (under-admission, never
// over).
func (ls *Leases[K]) Drop(tokens []int64) {
	var sum int64
	for _, v := range tokens {
		sum += v
	}
	ls.stats.LeaseDropped.Add(uint64(sum))
}

// Credit records a write on b that succeeded (or was not needed): the
// grant it took for the lease, per limit (nil: none), and the bucket as
// it left it (view, nil when unknown). written is what this replica
// computed each limit's state to be after the write (nil for a refund):
// a consumed total in view above it means another writer took tokens
// meanwhile.
func (ls *Leases[K]) Credit(b *LeaseBucket[K], grant []int64, view BucketView, written []bucket.State, now int64) {
	var sum int64
	for _, g := range grant {
		sum += g
	}
	h := ls.hold(b)
	if h == nil {
		// Cannot happen while the backend lets one write at a time
		// change the bucket; never mix limits if it does.
		ls.stats.LeaseDropped.Add(uint64(sum))
		return
	}
	defer h.mu.Unlock()
	if written != nil && view != nil && view.Config() == b.FP {
		for j, l := range b.Res.Limits {
			if s, ok := view.StateOf(l.Name); ok && j < len(written) && s.Consumed > written[j].Consumed {
				h.othersAt = now
			}
		}
	}
	h.view, h.viewAt = view, now
	if sum == 0 {
		return
	}
	for i, g := range grant {
		h.tokens[i] += g
		h.granted[i] = g
	}
	h.refilled()
	h.grantedAt = now
	h.expires = now + 2*ls.Horizon()
	if h.win != 0 {
		// Never spent past its window's end: the store frees the window
		// a margin after it, for any writer's clock.
		h.expires = min(h.expires, h.win*ls.LeaseWindowMs())
	}
	// Nor past a budget's period: the next one drops what leases of
	// this one hold (bucket.LeaseEnd).
	h.expires = min(h.expires, bucket.LeaseEndOf(b.Res.Limits, now))
	h.used = max(h.used, now)
	ls.stats.Leased.Add(uint64(sum))
	ls.stats.LeaseOutstanding.Add(sum)
}

// Add puts tokens (per limit of b) into b's lease that left the bucket
// for a call nobody took the answer of; they are dropped when the lease
// holds tokens under other limits.
func (ls *Leases[K]) Add(b *LeaseBucket[K], tokens []int64, now int64) {
	var sum int64
	for _, v := range tokens {
		sum += v
	}
	if sum == 0 {
		return
	}
	h := ls.hold(b)
	if h == nil {
		ls.stats.LeaseDropped.Add(uint64(sum))
		return
	}
	defer h.mu.Unlock()
	for i, v := range tokens {
		h.tokens[i] += v
	}
	h.refilled()
	h.expires = min(max(h.expires, now+2*ls.Horizon()), bucket.LeaseEndOf(b.Res.Limits, now))
	h.used = max(h.used, now)
	ls.stats.Leased.Add(uint64(sum))
	ls.stats.LeaseOutstanding.Add(sum)
}

// SharedSince reports whether this replica's writes have found another
// writer on k's bucket at or after since (ms).
func (ls *Leases[K]) SharedSince(k K, since int64) bool {
	h := ls.get(k)
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.othersAt > 0 && h.othersAt >= since
}

// Due lists the leases to return at now (idle for a horizon, or expired)
// and marks them busy; it forgets leases empty and unused for two
// horizons.
func (ls *Leases[K]) Due(now int64) []LeaseBucket[K] {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	var out []LeaseBucket[K]
	for k, h := range ls.m {
		h.mu.Lock()
		switch {
		case h.busy:
		case (h.held() > 0 || h.win != 0) && (now >= h.expires || now-h.used >= ls.Horizon()):
			// A lease spent to nothing still reports, so that the store
			// stops counting its tokens out before its window ends.
			h.busy = true
			out = append(out, LeaseBucket[K]{Key: k, Res: h.res, FP: h.fp})
		case h.held() == 0 && h.win == 0 && !h.reporting && now-h.used >= 2*ls.Horizon():
			h.gone = true
			delete(ls.m, k)
		}
		h.mu.Unlock()
	}
	return out
}

// All lists every lease that holds tokens and marks it busy, for Close.
func (ls *Leases[K]) All() []LeaseBucket[K] {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	var out []LeaseBucket[K]
	for k, h := range ls.m {
		h.mu.Lock()
		if h.held() > 0 || h.win != 0 {
			h.busy = true
			out = append(out, LeaseBucket[K]{Key: k, Res: h.res, FP: h.fp})
		}
		h.mu.Unlock()
	}
	return out
}

// StartRenewal marks b's lease busy for a renewal and reports true,
// unless a renewal or return of it is under way, or it holds tokens
// under other limits.
func (ls *Leases[K]) StartRenewal(b *LeaseBucket[K]) bool {
	h := ls.hold(b)
	if h == nil {
		return false
	}
	defer h.mu.Unlock()
	if h.busy {
		return false
	}
	h.busy, h.renewing, h.heldDrained = true, true, false
	return true
}

// Idle clears the busy mark a renewal or return set.
func (ls *Leases[K]) Idle(k K) {
	if h := ls.get(k); h != nil {
		h.mu.Lock()
		h.busy, h.renewing, h.heldDrained = false, false, false
		h.mu.Unlock()
	}
}

// Outrun reports whether the lease on some bucket of bs is live, has
// been spent down to less than the calls since ask of it, and has a
// renewal's grant on its way (a return grants nothing): this replica is asked more than its lease, and the
// next tokens it can give are those of the write in flight.
func (ls *Leases[K]) Outrun(bs []LeaseBucket[K], now int64) bool {
	for i := range bs {
		h := ls.get(bs[i].Key)
		if h == nil {
			continue
		}
		h.mu.Lock()
		out := h.outrun(bs[i].Res, bs[i].FP, now)
		h.mu.Unlock()
		if out {
			return true
		}
	}
	return false
}

// drainedRTTs is for how many round trips the bucket as this replica's
// last write left it tells whether the bucket is at its limit. At the
// limit a replica writes about once a round trip (each renewal follows
// the last), and each write renews what it saw; a bucket no longer
// written to is soon not known to be drained, so that a call is not
// denied on a bucket that has since refilled.
const drainedRTTs = 4

// Drained reports whether, for some bucket of bs under the limits bs
// resolved to, this replica's last write, less than a few round trips
// of rtt ms (drainedRTTs) before now, or before a call that has waited
// waited ms since it came, left it holding less than one hit: the bucket
// is at its limit, and lives off its refill. (A write that claims
// refill, as the DynamoDB backend's does, leaves what it did not claim
// pending, outside the tokens it holds.) False with no round trip known.
func (ls *Leases[K]) Drained(bs []LeaseBucket[K], now, rtt, waited int64) bool {
	if rtt <= 0 {
		return false
	}
	maxAge := drainedRTTs*rtt + max(waited, 0)
	for i := range bs {
		h := ls.get(bs[i].Key)
		if h == nil {
			continue
		}
		h.mu.Lock()
		d := h.drained(bs[i].Res, bs[i].FP, now, maxAge)
		h.mu.Unlock()
		if d {
			return true
		}
	}
	return false
}

// drained is Drained for one lease, h locked: its last write, at most
// maxAge ms before now.
//
// A lease that holds tokens under other limits than res's (a share that
// moved, edited records) answers for the limits it last wrote under: a
// bucket drained under those is at its limit while the write that folds
// the lease and claims under the new ones is on its way.
func (h *holding) drained(res Resolved, fp string, now, maxAge int64) bool {
	if !h.matches(res, fp) {
		if h.held() == 0 {
			return false
		}
		res, fp = h.res, h.fp
	}
	v := h.view
	if v == nil || v.Config() != fp || now-h.viewAt > maxAge {
		return false
	}
	for _, l := range res.Limits {
		if s, ok := v.StateOf(l.Name); ok && s.Tokens < bucket.Cost(l, 1) {
			return true
		}
	}
	return false
}

// drainedRenewing is drained for a call at the limit (AtLimit), h
// locked: false unless a renewal is on its way. Once a call found the
// view drained within maxAge while this renewal was on its way, that
// view stays drained for the calls after it until a write replaces it,
// the renewal ends or the lease expires, however long the renewal
// takes: a renewal slower than a few round trips (a table busy in a
// spike) would otherwise send every call after the first few to queue
// behind that very write for the tokens it is claiming for them.
func (h *holding) drainedRenewing(res Resolved, fp string, now, maxAge int64) bool {
	if !h.renewing || maxAge <= 0 {
		return false
	}
	if h.stillDrained(now) {
		return h.drained(res, fp, now, max(maxAge, now-h.viewAt))
	}
	if h.drained(res, fp, now, maxAge) {
		h.heldDrained, h.heldView = true, h.viewAt
		return true
	}
	return false
}

// stillDrained reports whether h's view was found drained while the
// renewal now on its way was (drainedRenewing), and no write has
// replaced that view nor has the lease expired since. h locked.
func (h *holding) stillDrained(now int64) bool {
	return h.renewing && h.heldDrained && h.heldView == h.viewAt && now < h.expires
}

// outrun is Outrun for one lease, h locked.
func (h *holding) outrun(res Resolved, fp string, now int64) bool {
	return h.renewing && h.dryAt > 0 && now < h.expires && h.matches(res, fp) &&
		slices.ContainsFunc(h.granted, func(g int64) bool { return g > 0 })
}

// Foreign reports whether b's lease holds tokens under other limits than
// b's: a renewal folds them into its write before it claims under b's.
func (ls *Leases[K]) Foreign(b *LeaseBucket[K]) bool {
	h := ls.get(b.Key)
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.matches(b.Res, b.FP) && h.held() > 0
}

// Busy reports whether a renewal or return of some lease is under way.
func (ls *Leases[K]) Busy() bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for _, h := range ls.m {
		h.mu.Lock()
		busy := h.busy
		h.mu.Unlock()
		if busy {
			return true
		}
	}
	return false
}
