// Package lease sizes the token leases of DESIGN section 11: tokens a
// replica moves out of a shared token bucket with one conditional write
// and then spends from its own memory, so that most decisions never wait
// for the store. It is pure arithmetic over integers and floats, with no
// I/O, no clock and no locks, like backend/bucket beside it; backend.Leases
// keeps the leases and each backend's store moves the tokens.
//
// Three things decide a lease's size, each per limit of a bucket (a
// request-count limit and a token limit of one bucket are sized apart):
//
//   - the replica's own demand: a Rate of the millitokens it spent
//     recently, so that a lease lasts about Policy.Horizon at that pace;
//   - the fleet's demand, another Rate, read off the total the bucket item
//     says was ever taken (its consumed counter): a replica's part of the
//     fleet's demand is its part of the leases the fleet may hold, so that
//     the fleet's outstanding leases stay within Policy.Share of the burst
//     however many replicas there are, without any of them knowing how
//     many there are;
//   - what the bucket still holds: a replica never takes more than half
//     its part of that, so leases shrink to nothing as the bucket nears
//     its limit.
//
// Three more keep leases whole in the transients (DESIGN section 13):
// demand is read as it arrives (Rate.Arriving), so a key that turns hot
// is seen at its new pace from its first calls; a lease renewed early
// grows at least twofold (Ask.Grow); and whatever the caps give, a lease
// is topped up to two round trips to the store of the replica's demand,
// near the limit out of its part of the refill, so that a far store puts
// no round trip on an admission. Short says when even that lease would
// not last a round trip: a bucket asked beyond its means from afar.
//
// Sizes only ever lower what is taken below what the bucket holds: the
// store's conditional write, not this package, guarantees that no token
// is spent before it has left the shared bucket.
package lease
