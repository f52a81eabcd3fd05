package backend

import "github.com/sluice-rl/sluice/backend/bucket"

// A gateway's check costs its lease nothing or one token, and the tokens
// its request uses come later, in a charge that Envoy's load balancing
// may send to another replica. A replica whose checks' charges land
// elsewhere would see its lease untouched by them and go on paying
// checks from it while the others' charges run the shared bucket into
// debt. So a check paid from a lease on a bucket that charges come to
// sets aside, within the lease, what this replica's charges on it cost
// on average: the set-aside cannot pay another check, and the lease runs
// low, is renewed and reads the bucket (debt and all) as fast as its
// requests use tokens, wherever their charges go. A charge that comes to
// this replica cancels the oldest set-aside before it is paid, so that
// with a request's two calls on one replica the lease pays the tokens
// used once, as before; a set-aside whose charge went elsewhere lapses
// after reserveLife. Set-asides move no tokens: the lease still holds
// them, reports them unspent and gives them back, so the store's
// accounting is as without them, and they only make the lease pay fewer
// checks.

// reserveLife is how long (ms) a check's set-aside waits for a charge
// to cancel it: long enough for the replica to renew its lease on the
// set-asides' account and read the bucket the other replicas' charges
// have put into debt (a renewal, or the view's refresh within
// maxViewAge), and short enough that a replica whose charges all go
// elsewhere is back to paying checks from its lease two seconds after
// its last one.
const reserveLife = 2 * maxViewAge

// maxSetAsides bounds the set-asides a lease keeps; past it a check is
// paid without one.
const maxSetAsides = 1024

// charged records on h (locked, lined up with res) a charge of hits:
// each limit's mean charge moves an eighth of the way to its cost (the
// first sets it), and the charge cancels the oldest set-aside live at
// now.
func (h *holding) charged(res Resolved, hits uint64, now int64) {
	if hits == 0 {
		return
	}
	for j, l := range res.Limits {
		c := bucket.Cost(l, hits)
		if h.meanCharge[j] == 0 {
			h.meanCharge[j] = c
		} else {
			h.meanCharge[j] += (c - h.meanCharge[j]) / 8
		}
	}
	h.lapse(now)
	h.cancelOldest()
}

// setAside is what a check paid from h now sets aside of limit j: the
// mean charge on it, while charges came to this replica on the bucket
// within two horizons of tau ms (0 otherwise, and for a bucket no
// charge has come to). h locked.
func (h *holding) setAside(j int, now, tau int64) int64 {
	if h.chargedAt == 0 || now-h.chargedAt > 2*tau || j >= len(h.meanCharge) {
		return 0
	}
	return h.meanCharge[j]
}

// free is what h holds of limit j that no set-aside holds back. h
// locked.
func (h *holding) free(j int) int64 {
	if j < len(h.reserved) {
		return h.tokens[j] - h.reserved[j]
	}
	return h.tokens[j]
}

// reserve records the set-asides amounts (lined up with h's limits) of
// a check paid at now, unless the lease keeps maxSetAsides already or
// they are all zero. h locked.
func (h *holding) reserve(amounts []int64, now int64) {
	var any bool
	for _, a := range amounts {
		any = any || a > 0
	}
	n := len(h.reserved)
	if !any || n != len(amounts) || len(h.setAsides) >= maxSetAsides*(n+1) {
		return
	}
	h.setAsides = append(h.setAsides, now)
	h.setAsides = append(h.setAsides, amounts...)
	for j, a := range amounts {
		h.reserved[j] += a
	}
}

// lapse drops the set-asides older than reserveLife at now. h locked.
func (h *holding) lapse(now int64) {
	for len(h.setAsides) > 0 && now-h.setAsides[0] > reserveLife {
		h.cancelOldest()
	}
}

// cancelOldest drops the oldest set-aside, if any. h locked.
func (h *holding) cancelOldest() {
	n := len(h.reserved)
	if len(h.setAsides) < n+1 {
		return
	}
	for j := range n {
		h.reserved[j] -= h.setAsides[1+j]
	}
	h.setAsides = h.setAsides[n+1:]
	if len(h.setAsides) == 0 {
		h.setAsides = nil
	}
}
