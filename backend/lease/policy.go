package lease

import (
	"math"

	"github.com/sluice-rl/sluice/backend/bucket"
)

// DefaultShare is the part of a limit's burst the whole fleet may hold in
// leases: small enough that the tokens a crash can strand, and the tokens
// one replica keeps from the others, stay a tenth of the burst.
const DefaultShare = 0.1

// Policy sizes leases. The zero Policy leases nothing.
type Policy struct {
	// Horizon is how long (ms) a lease should last at the replica's own
	// recent demand; 0 or less turns leases off. It is also the memory of
	// the demand estimates (the tau of Rate).
	Horizon int64
	// Share is the part of a limit's burst the fleet's outstanding leases
	// may reach together, from 0 to 1; 0 means DefaultShare.
	Share float64
}

// On reports whether p leases anything at all.
func (p Policy) On() bool { return p.Horizon > 0 }

func (p Policy) share() float64 {
	if p.Share <= 0 || p.Share > 1 {
		return DefaultShare
	}
	return p.Share
}

// Size is how many millitokens to lease for limit l, in whole tokens:
//   - own is the replica's demand and fleet the whole fleet's (own
//     included), both in millitokens per ms, as Rate and Counter estimate
//     them; a fleet estimate below own counts as own;
//   - avail is what the bucket holds after the decision the lease is
//     taken with.
//
// It is the smallest of a Horizon of own demand, the replica's part
// (own/fleet) of Share of the burst, and half its part of avail, so that
// leases vanish as the bucket nears its limit. It is never negative and
// never more than avail.
func (p Policy) Size(l bucket.Limit, own, fleet float64, avail int64) int64 {
	if !p.On() || !(own > 0) || avail <= 0 || l.Burst <= 0 {
		return 0
	}
	part := 1.0
	if fleet > own {
		part = own / fleet
	}
	want := math.Min(own*float64(p.Horizon), p.share()*float64(l.Burst)*part)
	want = math.Min(want, float64(avail)*part/2)
	if !(want >= bucket.Milli) { // NaN-proof: less than a token, or nothing
		return 0
	}
	n := int64(min(want, float64(avail)))
	n -= n % bucket.Milli
	return min(n, avail)
}

// Renew reports whether a lease that holds held millitokens of a limit,
// after its last grant sized it at granted, should be renewed now: once
// half of it is spent, early enough that the renewal's write is back
// before the rest runs out at a steady pace. A lease granted nothing is
// not renewed ahead: near its limit a bucket is asked request by request.
func Renew(held, granted int64) bool {
	return granted > 0 && held <= granted/2
}
