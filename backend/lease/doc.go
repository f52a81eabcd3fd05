// Package lease sizes the token leases of DESIGN section 11: tokens a
// replica moves out of a shared token bucket with one conditional write
// and then spends from its own memory, so that most decisions never wait
// for the store. It is pure arithmetic over integers and floats, with no
// I/O, no clock and no locks, like backend/bucket beside it; the DynamoDB
// backend does the writes.
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
//     its limit and the decision falls back to one write per request.
//
// Sizes only ever lower what is taken below what the bucket holds: the
// store's conditional write, not this package, guarantees that no token
// is spent before it has left the shared bucket.
package lease
