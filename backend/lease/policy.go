package lease

import (
	"math"

	"github.com/sluice-rl/sluice/backend/bucket"
)

// DefaultShare is the part of a limit's burst the whole fleet may hold in
// leases: small enough that the tokens a crash can strand, and the tokens
// one replica keeps from the others, stay a tenth of the burst.
const DefaultShare = 0.1

// DefaultWindow is the shortest time (ms) over which the first calls on a
// key are read as a rate (Rate.Arriving): one call is read as one a
// second, so the first lease on a 30 s horizon is 30 calls' worth.
const DefaultWindow = 1000

// Policy sizes leases. The zero Policy leases nothing.
type Policy struct {
	// Horizon is how long (ms) a lease should last at the replica's own
	// recent demand; 0 or less turns leases off. It is also the memory of
	// the demand estimates (the tau of Rate).
	Horizon int64
	// Share is the part of a limit's burst the fleet's outstanding leases
	// may reach together, from 0 to 1; 0 means DefaultShare.
	Share float64
	// Window is the shortest time (ms) the first calls on a key are
	// averaged over; 0 means DefaultWindow.
	Window int64
}

// On reports whether p leases anything at all.
func (p Policy) On() bool { return p.Horizon > 0 }

func (p Policy) share() float64 {
	if p.Share <= 0 || p.Share > 1 {
		return DefaultShare
	}
	return p.Share
}

// WindowMs is the Window in force.
func (p Policy) WindowMs() int64 {
	if p.Window <= 0 {
		return DefaultWindow
	}
	return p.Window
}

// Ask is what one lease of one limit is sized from. Rates are in
// millitokens per ms, as Rate and Counter estimate them.
type Ask struct {
	// Own is the replica's demand; Fleet the whole fleet's, Own
	// included (a Fleet below Own counts as Own).
	Own, Fleet float64
	// Avail is what the bucket holds after the decision the lease is
	// taken with; Held what the lease still holds.
	Avail, Held int64
	// Grow is the size of the last grant when it was spent faster than
	// planned (renewed within half a Horizon of being granted), else 0:
	// the next grant is then at least twice it, so that a key that turns
	// hot reaches its lease in a few round trips whatever the estimates.
	Grow int64
	// RTT is the store's measured round trip (ms), 0 when unknown.
	RTT int64
}

// Size is how many millitokens to add to a lease of limit l, in whole
// tokens.
//
// Far from the limit the lease is topped up to a Horizon of own demand
// (the grant at least twice a.Grow), with the lease capped at the
// replica's part (Own/Fleet) of Share of the burst and the grant at half
// its part of Avail, so that leases shrink as the bucket nears its limit.
// Whatever those give, the lease is topped up to two round trips of own
// demand, out of half its part of Avail or, near the limit, where that is
// nothing, out of its part of the refill over those round trips, but
// never more than half of Avail: enough to admit from memory until the
// next grant is back, so that a far store puts no round trip on an
// admission. It is never negative and never more than Avail: the store's
// conditional write, not this function, keeps the bound.
func (p Policy) Size(l bucket.Limit, a Ask) int64 {
	own := a.Own
	if !p.On() || !(own > 0) || a.Avail <= 0 || l.Burst <= 0 {
		return 0
	}
	part := 1.0
	if a.Fleet > own {
		part = own / a.Fleet
	}
	avail, held := float64(a.Avail), float64(max(a.Held, 0))
	want := math.Max(own*float64(p.Horizon)-held, 2*float64(a.Grow))
	want = math.Min(want, p.share()*float64(l.Burst)*part-held)
	want = math.Min(want, avail*part/2)
	if a.RTT > 0 && l.Period > 0 {
		// Two round trips of demand, from half its part of the bucket,
		// or near the limit from its part of the refill meanwhile, but
		// never more than half of what the bucket holds: the rest is for
		// the other replicas whose writes are on their way. Claims that
		// leave room for each other commute in the store (the DynamoDB
		// backend's incremental write); a replica that took all there is,
		// each round trip, would make every other replica's write at the
		// limit lose its race, round trip after round trip. Alone, it
		// still takes the whole refill: half of what builds up in a round
		// trip, and the other half the next.
		rtt2 := 2 * float64(a.RTT)
		refill := float64(l.Amount) / float64(l.Period) * part
		want = math.Max(want, math.Min(own*rtt2, math.Min(math.Max(avail*part/2, refill*rtt2), avail/2))-held)
	}
	if !(want >= bucket.Milli) { // NaN-proof: less than a token, or nothing
		return 0
	}
	n := int64(math.Min(want, avail))
	n -= n % bucket.Milli
	return min(n, a.Avail)
}

// Short reports whether the lease a replica asked as a says could get
// (Size, holding nothing) lasts less than one round trip at its demand:
// its callers then wait a round trip for the store or go without, and a
// bucket asked that much is at its limit, or will be within a few round
// trips. False when no round trip is known.
func (p Policy) Short(l bucket.Limit, a Ask) bool {
	if a.RTT <= 0 || !(a.Own > 0) {
		return false
	}
	a.Held = 0
	return float64(p.Size(l, a)) < a.Own*float64(a.RTT)
}

// Renew reports whether a lease that holds held millitokens of a limit,
// after its last grant sized it at granted, should be renewed now, while
// the replica spends own millitokens per ms on it and the store is rtt ms
// away: once half of it is spent, or once it would last less than three
// round trips, early enough that the renewal's write is back before the
// rest runs out. A lease granted nothing is not renewed ahead: the next
// call that finds it empty asks the store.
func Renew(held, granted int64, own float64, rtt int64) bool {
	if granted <= 0 {
		return false
	}
	return held <= granted/2 || float64(held) < own*3*float64(rtt)
}
