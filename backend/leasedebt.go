package backend

import "github.com/sluice-rl/sluice/backend/bucket"

// A lease holds tokens that left the bucket, so it may spend them
// whatever the bucket holds now, except when the bucket is in debt: a
// charge on another replica may take the shared bucket so far below
// zero that the limit as a whole (the bucket plus every lease out) is at
// or below zero, and then its checks and admissions are denied on every
// replica, this one's included (DESIGN section 16). A replica learns of
// such a charge only from its own writes, so a lease whose view of a
// shared bucket could be out of date is renewed in the background even
// when it holds plenty: otherwise a replica whose calls are checks of
// zero hits, which spend nothing, would answer them OK from a full lease
// for as long as it lasts while the tenant's responses run up its debt
// elsewhere.

// staleRTTs and maxViewAge bound how often a lease's view is refreshed
// for freshness alone (viewStale): once a second per bucket and replica,
// and never more often than every few round trips.
const (
	staleRTTs  = 4
	maxViewAge = 1000
)

// Charged records that a charge (backend.Request.Charge) came to this
// replica on the buckets bs at now: their limits may be in debt, run up
// on any replica, and their leases keep their views fresh (viewStale).
// A replica that sees only checks and admissions on a bucket is not
// told; in a gateway's pattern the charges of a tenant's responses come
// to every replica its checks come to.
func (ls *Leases[K]) Charged(bs []LeaseBucket[K], now int64) {
	hs, unlock, ok := ls.lockAll(bs, ls.lockOrder(bs), true)
	if !ok {
		return
	}
	defer unlock()
	for i := range bs {
		hs[i].chargedAt = max(hs[i].chargedAt, now)
	}
}

// inDebt reports whether h's view of the bucket, refilled to now, shows
// some limit of res at or below zero counting every lease out: the limit
// as a whole is in debt, and this lease may not pay a call. A view that
// is expired, under other limits or missing says nothing. The tokens
// out count whether spent or not, so this errs towards paying. h locked.
func (h *holding) inDebt(res Resolved, fp string, now int64) bool {
	v := h.view
	if v == nil || v.Config() != fp || v.Expired(now) {
		return false
	}
	for _, l := range res.Limits {
		if s, ok := v.StateOf(l.Name); ok {
			if s = bucket.Refill(l, s, now); s.Tokens < 0 && s.Tokens+s.Leased() <= 0 {
				return true
			}
		}
	}
	return false
}

// viewStale reports whether h's view of its bucket should be refreshed
// before it grows older: charges came to this replica on the bucket
// within two horizons (tau ms), other replicas write it, and the view is
// older than a second and than a few round trips of rtt ms. A bucket no
// charge comes to cannot be in debt, and one this replica writes alone
// is as its writes left it: neither costs a write for its view's sake.
// h locked.
func (h *holding) viewStale(fp string, now, rtt, tau int64) bool {
	v := h.view
	if v == nil || v.Config() != fp || h.chargedAt == 0 || now-h.chargedAt > 2*tau {
		return false
	}
	return now-h.viewAt >= max(staleRTTs*rtt, maxViewAge) && h.othersWrite(v, now, tau)
}

// othersWrite reports whether other replicas write the bucket h's view v
// is of: a write of this replica found another's since the state it
// started from, within two horizons (tau ms), or v counts more out on
// lease than this replica's own. The first sign alone misses a replica
// that has written a bucket once, on top of the others' first grants.
// h locked.
func (h *holding) othersWrite(v BucketView, now, tau int64) bool {
	if h.othersAt > 0 && now-h.othersAt <= 2*tau {
		return true
	}
	for j, l := range h.res.Limits {
		s, ok := v.StateOf(l.Name)
		if !ok {
			continue
		}
		var own int64
		if j < len(h.out) {
			own = h.out[j]
		}
		if s.Leased() > own {
			return true
		}
	}
	return false
}
