package dynamodb

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/backend/lease"
)

// leases are the tokens this replica has taken out of the table's buckets
// to spend from memory (DESIGN section 11). A token gets into a lease only
// through a bucket write that took it, the same conditional write a
// decision makes, so spending it needs no further call: the fleet never
// admits a token that has not left the shared bucket.
//
// A lease is topped up by a renewal in the background once half of its
// last grant is spent or it would last less than three round trips
// (lease.Renew), so steady traffic never waits; it goes back to its
// bucket (a write that ADDs, capped at the burst) when the key has been
// idle for a horizon, when it expires (two horizons after its last
// grant), when its bucket's limits change, and on Close. A decision its
// lease cannot pay folds what is left of the lease back into its own
// write: the lease is then spent or returned with that write.
//
// Everything a lease holds is guarded by its own mutex; leases.mu guards
// only the map. No lock is held across a DynamoDB call.
type leases struct {
	policy lease.Policy
	stats  *Stats

	mu sync.Mutex
	m  map[bucketKey]*holding
}

// holding is this replica's lease on one bucket. It lives in leases.m
// from its first grant until it has been empty and unused for two
// horizons.
type holding struct {
	mu sync.Mutex
	// fp is the fingerprint of the limits the tokens were taken under,
	// and res their resolution (for the TTL of a renewal's write). A
	// decision under other limits does not spend them: it folds them
	// back into its write.
	fp     string
	res    backend.Resolved
	tokens []int64 // millitokens held, per res.Limits
	// granted is the size of the last grant, per limit: a lease down to
	// half of it is renewed.
	granted []int64
	// grantedAt is when (ms) the last grant came: a lease renewed within
	// half a horizon of it went faster than planned, and grows.
	grantedAt int64
	// item is the bucket as this replica's last write left it, set
	// with the tokens under mu, so that a decision paid from the lease
	// reads the bucket and the lease of one moment.
	item *bucketItem
	own  []lease.Rate // this replica's spending, per limit
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
	fleet   []lease.Counter // the fleet's taking (the item's tc), per limit
	expires int64           // ms: from then on the tokens are only returned
	used    int64           // ms: the last spend or grant
	// othersAt is when (ms) a write of this replica last found that
	// another writer had taken tokens from the bucket since the state the
	// write started from: the item is shared, and kept alive by others.
	othersAt int64
	// busy: a renewal or return of this lease is under way; no second
	// one starts.
	busy bool
}

func newLeases(p lease.Policy, stats *Stats) *leases {
	return &leases{policy: p, stats: stats, m: map[bucketKey]*holding{}}
}

func (ls *leases) get(k bucketKey) *holding {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.m[k]
}

func (ls *leases) getOrAdd(k bucketKey) *holding {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	h := ls.m[k]
	if h == nil {
		h = &holding{}
		ls.m[k] = h
	}
	return h
}

// horizon is the policy's horizon in ms; idle after it, expired after two.
func (ls *leases) horizon() int64 { return ls.policy.Horizon }

// matches reports whether h's tokens line up with t's limits: the same
// limits (fingerprint) in the same order.
func (h *holding) matches(t *target) bool {
	if h.fp != t.fp || len(h.res.Limits) != len(t.res.Limits) {
		return false
	}
	for i, l := range h.res.Limits {
		if t.res.Limits[i].Name != l.Name {
			return false
		}
	}
	return true
}

// align makes h hold the limits of res (fingerprint fp), keeping the
// demand estimates of the limits that stay by name. Its tokens must have
// been taken out first: tokens never move between limits.
func (h *holding) align(res backend.Resolved, fp string) {
	n := len(res.Limits)
	own, quick, fleet := make([]lease.Rate, n), make([]lease.Rate, n), make([]lease.Counter, n)
	for i, l := range res.Limits {
		if j := slices.IndexFunc(h.res.Limits, func(o bucket.Limit) bool { return o.Name == l.Name }); j >= 0 && j < len(h.own) {
			own[i], quick[i], fleet[i] = h.own[j], h.quick[j], h.fleet[j]
		}
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

// take empties h into a slice lined up with res's limits: what the lease
// holds of each limit by name. Tokens of a limit res no longer has are
// gone with it (counted as dropped). It returns nil when h holds nothing.
func (ls *leases) take(h *holding, res backend.Resolved) []int64 {
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

// withdraw takes the tokens of t's lease into t.lease, for a decision
// that folds them into its write.
func (ls *leases) withdraw(t *target) {
	h := ls.get(t.key)
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	t.lease = ls.take(h, t.res)
}

// peek copies what t's lease holds into t.lease, for a denial decided
// from the last seen bucket and the lease together; nothing is taken.
func (ls *leases) peek(t *target) {
	t.lease = nil
	h := ls.get(t.key)
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.matches(t) || h.held() == 0 {
		return
	}
	t.lease = slices.Clone(h.tokens)
}

// restore puts back what a decision withdrew and could not write: only
// after a write that certainly did not happen (every attempt lost its
// race), never after one whose outcome is unknown, which might have
// returned the tokens to the bucket already.
func (ls *leases) restore(t *target) {
	if t.lease == nil {
		return
	}
	h := ls.getOrAdd(t.key)
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.matches(t) {
		if h.held() > 0 {
			ls.drop(t)
			return
		}
		h.align(t.res, t.fp)
	}
	var sum int64
	for i, v := range t.lease {
		h.tokens[i] += v
		sum += v
	}
	ls.stats.LeaseOutstanding.Add(sum)
	t.lease = nil
}

// drop forgets what a decision withdrew and could not write: the bucket
// is short of those tokens until it refills (under-admission, never
// over).
func (ls *leases) drop(t *target) {
	var sum int64
	for _, v := range t.lease {
		sum += v
	}
	ls.stats.LeaseDropped.Add(uint64(sum))
	t.lease = nil
}

// asks returns what each of t's limits' next grant is sized from at now
// (all but what the bucket holds): this replica's demand as it arrives,
// the greater of the horizon's and what it was asked over the last
// second (quick, read over at least a round trip of rtt ms), so that a
// spike is met at its pace; the fleet's, after reading the consumed
// totals of the item t holds; what the lease holds; and the last grant
// when it went faster than planned. nil: grant nothing.
func (ls *leases) asks(t *target, now, rtt int64) []lease.Ask {
	h := ls.getOrAdd(t.key)
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.matches(t) {
		if h.held() > 0 {
			// Tokens under other limits wait for a decision that folds
			// them; meanwhile this one grants nothing.
			return nil
		}
		h.align(t.res, t.fp)
	}
	tau, window := ls.horizon(), ls.policy.WindowMs()
	fast := h.grantedAt > 0 && now-h.grantedAt < tau/2
	asks := make([]lease.Ask, len(h.own))
	for i, l := range t.res.Limits {
		if t.item != nil && t.item.cfg == t.fp {
			if s, ok := t.item.stateOf(l.Name); ok {
				h.fleet[i].Observe(s.Consumed, now, tau)
			}
		}
		own := max(h.own[i].Arriving(now, tau, window), h.quick[i].Arriving(now, quickTau, max(rtt, 10)))
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

// quickTau is the memory (ms) of holding.quick.
const quickTau = 1000

// unmetWindow is the shortest time (ms) holding.unmet is read over as a
// rate: calls arriving within a few ms of each other are a storm's
// pace, a single call is not.
const unmetWindow = 10

// refilled marks h's lease able to pay again: no call waits on it.
func (h *holding) refilled() {
	h.dryAt = 0
	clear(h.unmet)
}

// hold returns t's holding locked and lined up with t's limits, or nil
// (nothing locked) when it holds tokens under other limits, which wait
// for a decision that folds them.
func (ls *leases) hold(t *target) *holding {
	h := ls.getOrAdd(t.key)
	h.mu.Lock()
	if !h.matches(t) {
		if h.held() > 0 {
			h.mu.Unlock()
			return nil
		}
		h.align(t.res, t.fp)
	}
	return h
}

// credit adds the tokens t's write took for the lease (t.grant), and
// records the bucket as the write left it (t.item).
func (ls *leases) credit(t *target, now int64) {
	var sum int64
	for _, g := range t.grant {
		sum += g
	}
	h := ls.hold(t)
	if h == nil {
		// Cannot happen while t holds the bucket's lane (nothing else
		// grants meanwhile); never mix limits if it does.
		ls.stats.LeaseDropped.Add(uint64(sum))
		return
	}
	defer h.mu.Unlock()
	if !t.refund && t.item != nil && t.item.cfg == t.fp {
		// The write left each limit's consumed total at what this
		// replica computed (t.states), unless others added to it.
		for j, l := range t.res.Limits {
			if s, ok := t.item.stateOf(l.Name); ok && s.Consumed > t.states[j].Consumed {
				h.othersAt = now
			}
		}
	}
	h.item = t.item
	if sum == 0 {
		return
	}
	for i, g := range t.grant {
		h.tokens[i] += g
		h.granted[i] = g
	}
	h.refilled()
	h.grantedAt = now
	h.expires = now + 2*ls.horizon()
	h.used = max(h.used, now)
	ls.stats.Leased.Add(uint64(sum))
	ls.stats.LeaseOutstanding.Add(sum)
}

// add puts tokens (per limit of t) into t's lease that left the bucket
// for a call nobody took the answer of; they are dropped when the lease
// holds tokens under other limits.
func (ls *leases) add(t *target, tokens []int64, now int64) {
	var sum int64
	for _, v := range tokens {
		sum += v
	}
	if sum == 0 {
		return
	}
	h := ls.hold(t)
	if h == nil {
		ls.stats.LeaseDropped.Add(uint64(sum))
		return
	}
	defer h.mu.Unlock()
	for i, v := range tokens {
		h.tokens[i] += v
	}
	h.refilled()
	h.expires = max(h.expires, now+2*ls.horizon())
	h.used = max(h.used, now)
	ls.stats.Leased.Add(uint64(sum))
	ls.stats.LeaseOutstanding.Add(sum)
}

// sharedSince reports whether this replica's writes have found another
// writer on k's bucket at or after since (ms).
func (ls *leases) sharedSince(k bucketKey, since int64) bool {
	h := ls.get(k)
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.othersAt > 0 && h.othersAt >= since
}

// due lists the leases to return at now (idle for a horizon, or expired)
// and marks them busy; it forgets leases empty and unused for two
// horizons.
func (ls *leases) due(now int64) []target {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	var out []target
	for k, h := range ls.m {
		h.mu.Lock()
		switch {
		case h.busy:
		case h.held() > 0 && (now >= h.expires || now-h.used >= ls.horizon()):
			h.busy = true
			out = append(out, target{key: k, res: h.res, fp: h.fp})
		case h.held() == 0 && now-h.used >= 2*ls.horizon():
			delete(ls.m, k)
		}
		h.mu.Unlock()
	}
	return out
}

// all lists every lease that holds tokens and marks it busy, for Close.
func (ls *leases) all() []target {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	var out []target
	for k, h := range ls.m {
		h.mu.Lock()
		if h.held() > 0 {
			h.busy = true
			out = append(out, target{key: k, res: h.res, fp: h.fp})
		}
		h.mu.Unlock()
	}
	return out
}

// unmet records what req asks of the leases hs (locked, lined up with
// ts) that could not pay it all.
func unmet(hs []*holding, ts []target, req *backend.Request, now int64) {
	for i, h := range hs {
		if !h.matches(&ts[i]) {
			continue
		}
		if h.dryAt == 0 {
			h.dryAt = now
		}
		for j, l := range ts[i].res.Limits {
			h.unmet[j] += bucket.Cost(l, req.Hits)
		}
	}
}

// outrun reports whether the lease on some bucket of ts is live, has
// been spent down to less than the calls since ask of it, and has a
// grant on its way: this replica is asked more than its lease, and the
// next tokens it can give are those of the write in flight.
func (ls *leases) outrun(ts []target, now int64) bool {
	for i := range ts {
		h := ls.get(ts[i].key)
		if h == nil {
			continue
		}
		h.mu.Lock()
		out := h.busy && h.dryAt > 0 && now < h.expires && h.matches(&ts[i]) && slices.ContainsFunc(h.granted, func(g int64) bool { return g > 0 })
		h.mu.Unlock()
		if out {
			return true
		}
	}
	return false
}

// startRenewal marks t's lease busy for a renewal and reports true,
// unless a renewal or return of it is under way, or it holds tokens
// under other limits.
func (ls *leases) startRenewal(t *target) bool {
	h := ls.hold(t)
	if h == nil {
		return false
	}
	defer h.mu.Unlock()
	if h.busy {
		return false
	}
	h.busy = true
	return true
}

// idle clears the busy mark a renewal or return set.
func (ls *leases) idle(k bucketKey) {
	if h := ls.get(k); h != nil {
		h.mu.Lock()
		h.busy = false
		h.mu.Unlock()
	}
}

// sweep returns the leases due, every quarter horizon (at most a second
// apart), until ctx ends.
func (b *Backend) sweep(ctx context.Context) {
	every := min(max(time.Duration(b.leases.horizon())*time.Millisecond/4, 10*time.Millisecond), time.Second)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		b.returnAll(ctx, b.leases.due(b.now()))
	}
}

// returnAll gives the leases of ts back to their buckets, a few at a
// time, each within backgroundTimeout and ctx.
func (b *Backend) returnAll(ctx context.Context, ts []target) {
	const parallel = 8
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for _, t := range ts {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			b.background(ctx, t, giveBack)
		}()
	}
	wg.Wait()
}

// backgroundTimeout bounds a renewal's or a return's write, and a
// decision's write once its callers may have stopped waiting (detach).
const backgroundTimeout = 5 * time.Second

// background makes a renewal or a return of t's lease through t's lane,
// as a call of its own kind, and clears the lease's busy mark after.
func (b *Backend) background(ctx context.Context, t target, kind callKind) {
	defer b.leases.idle(t.key)
	ctx, cancel := context.WithTimeout(ctx, backgroundTimeout)
	defer cancel()
	c := newCall(ctx, &backend.Request{Entity: t.key.entity, Resource: t.key.resource}, t.group())
	c.kind = kind
	batch, err := b.lanes.enter(ctx, c, t.key)
	if err != nil || batch == nil {
		return // gave up waiting, or another batch took it along
	}
	ts := []target{t}
	if len(batch) == 1 {
		defer b.lanes.leave(t.key)
		b.decideBatch(ctx, ts, batch)
		return
	}
	_ = b.lead(ctx, ts, []bucketKey{t.key}, batch)
}

// spend answers req from this replica's leases on every bucket of ts,
// when each holds what req costs under the limits it resolved to now
// and has not expired: no DynamoDB call, no wait. The answer's tokens
// are the bucket as this replica's last write left it, refilled to now,
// plus what the lease holds after paying (at most the burst less the
// cost): exact with one replica, an estimate with several, whose writes
// it has not seen. A lease left at half its last grant or less is renewed
// in the background.
//
// A call arriving (not one handed back from a batch) counts as this
// replica's demand whether the lease pays it or not: demand is what is
// asked, so that a replica whose lease runs dry at the limit still sees
// how much more it is asked than it gets.
func (b *Backend) spend(ts []target, req *backend.Request, level backend.Level, arriving bool) (backend.Decision, bool) {
	now := b.now()
	tau, window, rtt := b.leases.horizon(), b.leases.policy.WindowMs(), b.rtt.ms()
	var hs [2]*holding
	for i := range ts {
		if arriving {
			hs[i] = b.leases.getOrAdd(ts[i].key)
		} else if hs[i] = b.leases.get(ts[i].key); hs[i] == nil {
			return backend.Decision{}, false
		}
	}
	order := []int{0}
	if len(ts) == 2 {
		order = []int{0, 1}
		if less(ts[1].key, ts[0].key) {
			order = []int{1, 0}
		}
	}
	for _, i := range order {
		hs[i].mu.Lock()
	}
	unlock := func() {
		for _, i := range order {
			hs[i].mu.Unlock()
		}
	}
	if arriving {
		for i := range ts {
			h := hs[i]
			if !h.matches(&ts[i]) {
				if h.held() > 0 {
					continue // tokens under other limits: wait for a fold
				}
				h.align(ts[i].res, ts[i].fp)
			}
			for j, l := range ts[i].res.Limits {
				c := bucket.Cost(l, req.Hits)
				h.own[j].Add(c, now, tau)
				h.quick[j].Add(c, now, quickTau)
			}
			h.used = max(h.used, now)
		}
	}
	var limits []bucket.Limit
	for i := range ts {
		h := hs[i]
		paid := h.matches(&ts[i]) && now < h.expires
		for j, l := range ts[i].res.Limits {
			paid = paid && h.tokens[j] >= bucket.Cost(l, req.Hits)
		}
		if !paid {
			if arriving {
				unmet(hs[:len(ts)], ts, req, now)
			}
			unlock()
			return backend.Decision{}, false
		}
		limits = append(limits, ts[i].res.Limits...)
	}
	results := make([]bucket.Result, 0, len(limits))
	var renew []target
	for i := range ts {
		h, t := hs[i], &ts[i]
		var spent int64
		for j, l := range t.res.Limits {
			c := bucket.Cost(l, req.Hits)
			h.tokens[j] -= c
			spent += c
			view := bucket.State{Clock: now}
			if it := h.item; it != nil && !it.expired(now) && it.cfg == t.fp {
				if s, ok := it.stateOf(l.Name); ok {
					view = bucket.Refill(l, s, now)
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
		b.stats.LeaseOutstanding.Add(-spent)
		if h.busy {
			continue
		}
		for j := range h.tokens {
			if lease.Renew(h.tokens[j], h.granted[j], h.own[j].Arriving(now, tau, window), rtt) {
				h.busy = true
				renew = append(renew, target{key: t.key, res: t.res, fp: t.fp})
				break
			}
		}
	}
	unlock()
	for _, t := range renew {
		b.goBackground(func() { b.background(b.bg, t, renewal) })
	}
	b.stats.LocalAnswers.Add(1)
	return backend.Decision{Allowed: true, Limits: limits, Results: results,
		Binding: bucket.Binding(limits, results), Level: level}, true
}
