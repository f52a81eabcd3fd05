package rlqs

import (
	"context"
	"errors"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// takeAttempts bounds the decisions one take makes: the first asks for
// everything, a denied one says what the bucket held, and the next asks
// for that; another writer may have taken it meanwhile.
const takeAttempts = 3

// errPerRequest refuses a bucket whose limits count requests apart from
// hits (per_request): a take of n tokens is one decision, which such a
// limit would charge one token.
var errPerRequest = errors.New("a per_request limit cannot be leased to Envoy's quota filter")

// take moves up to want tokens, and at least least of them, out of req's
// shared bucket with be's ordinary decisions, so that every backend
// serves assignments with the write it already makes atomic. It returns
// what it took and the last decision (whose Limits tell the bucket's
// capacity). A decision that is not limited takes nothing and says so:
// the bucket is not limited. A bucket holding less than least is left
// as it is: a take too small for anything to be sent with it would be a
// write for no assignment, and the one made for the assignment later a
// second.
func take(ctx context.Context, be backend.Backend, req backend.Request, want, least uint64) (uint64, backend.Decision, error) {
	req.Hits = want
	var d backend.Decision
	for range takeAttempts {
		var err error
		if d, err = be.Decide(ctx, &req); err != nil {
			return 0, d, err
		}
		for _, l := range d.Limits {
			if l.PerRequest {
				return 0, d, errPerRequest
			}
		}
		if !d.Limited() || req.Hits == 0 {
			return 0, d, nil
		}
		if d.Allowed {
			return req.Hits, d, nil
		}
		held := available(d)
		if held == 0 || held < least || held >= req.Hits {
			// Nothing left, too little, or a denial not for want of
			// tokens (answered without the store): the next plan asks
			// again.
			return 0, d, nil
		}
		req.Hits = held
	}
	return 0, d, nil
}

// available is how many whole tokens every limit of a denied decision
// still held.
func available(d backend.Decision) uint64 {
	var n uint64
	for i, r := range d.Results {
		t := uint64(max(r.Tokens, 0) / bucket.Milli)
		if i == 0 || t < n {
			n = t
		}
	}
	return n
}
