// Package rlqs serves Envoy's rate limit quota service (RLQS, DESIGN
// section 15): envoy.service.rate_limit_quota.v3.RateLimitQuotaService,
// the stream Envoy's rate_limit_quota HTTP filter keeps open to learn
// what to enforce. It sits beside package ratelimit, over the same
// backend and rules: a quota assignment is a lease whose holder is an
// Envoy.
//
// # The model
//
// One stream is one Envoy. The Envoy reports, for each bucket it sorts
// requests into (a BucketId, a map of strings), how many requests it
// allowed and denied since its last report; the first report of a
// bucket comes with its first request. The Service answers with
// assignments: ALLOW_ALL, DENY_ALL, or a token bucket (a rate a second
// and a burst) with a time to live, which the Envoy enforces alone until
// it expires.
//
// A BucketId finds its rule as a descriptor would
// (descriptors.Config.MatchBucketID), and with it the entity, resource
// and limits of a shared bucket of the backend. Before a token bucket is
// sent, every token it can admit before its TTL ends (its burst and its
// refill) is taken from that shared bucket with the backend's ordinary
// decision. So the requests all Envoys admit, on any number of streams
// and replicas, and the ShouldRateLimit calls the backend allows, never
// pass the bucket's burst plus its refill since its first use: the bound
// of DESIGN section 15. A span that starts later may also see what was
// paid before it and not yet admitted, at most what the replicas held
// for the bucket's Envoys then (docs/rlqs.md, The bound; span_test.go).
//
// # Lifetimes
//
// A slot is one bucket of one stream. It lives from the bucket's first
// report until the bucket is abandoned (no requests in it for
// Policy.Idle) or the stream ends; what it holds then (tokens taken and
// not yet admissible by its Envoy) is counted as stranded. A slot
// remembers what it sent (its active assignment), what its Envoy
// reported admitted, and a bank of tokens taken but not yet issued.
//
// # Renewals
//
// Each slot is renewed before its assignment expires, or at once when a
// report shows denials beyond it. A renewal sizes the Envoy's bucket to
// its reported demand (plan.go), takes what that costs from the bank
// and the shared bucket (take.go), and either extends the active bucket
// (Envoy keeps its tokens, and only the refill beyond what was paid is
// taken) or replaces it (the old one's unpaid refill is credited back).
// Reports true up the accounts: what an Envoy admitted beyond what it
// was issued is a debt charged on its next take, and what it was issued
// beyond what it admitted and may still admit goes back to its bank
// (slot.go). While a shared bucket is short for some stream, every
// stream of the replica sizes that bucket's Envoys at their demand,
// renews them within half the bucket's filling time, and gives excess
// banks up to the replica's spares for the bucket (spare.go), from which
// the next take of any of its slots on the replica is paid first: a
// refund folded into the next take, so that a renewal writes the shared
// bucket once at most, and nothing given up can lift the bucket above
// its burst.
//
// The sizing is pure arithmetic on integers and the slot's state, tested
// on a simulated clock (sim_test.go); the streams are tested over real
// gRPC with a client that behaves as Envoy's filter does
// (rlqs/rlqstest), on the memory, DynamoDB and Redis backends.
package rlqs
