// Package backend holds what every Sluice backend shares: the Backend
// interface the service calls, the request and decision it exchanges, the
// four-level resolution of a bucket's limits, the TTL rules of the
// source ADRs, and the leases (DESIGN section 11) of the backends whose
// store is shared by a fleet: Leases keeps one replica's, RoundTrip the
// store's distance, Background the work that outlives calls. The
// backends themselves live in the subpackages (memory, dynamodb and
// redis), each keeping only what it owns: how its store moves tokens. The
// arithmetic is in backend/bucket, lease sizing in backend/lease.
//
// A Request names one bucket (entity and resource, optionally a parent
// entity to charge too) and carries the limits the mapping config gives it.
// The backend resolves the limits that really apply (an operator's record
// beats the file), decides with the bucket arithmetic and persists the
// result, then answers with a Decision.
package backend

import (
	"context"

	"github.com/sluice-rl/sluice/backend/bucket"
)

// Backend decides and persists charges against token buckets. A Backend is
// safe for concurrent use. Decide honours ctx's deadline: a backend that
// cannot answer in time returns an error and the caller applies its
// failure policy.
type Backend interface {
	Decide(ctx context.Context, req *Request) (Decision, error)
}

// Request asks for one charge against one bucket.
type Request struct {
	// Entity and Resource name the bucket.
	Entity   string
	Resource string
	// Parent, when not empty, names an entity charged atomically with
	// Entity (same resource): the request passes only if both buckets pass.
	Parent string
	// Defaults are the limits the mapping config gives this resource
	// (level 3). They may be empty.
	Defaults []bucket.Limit
	// Hits is the request's weight; zero checks without consuming.
	Hits uint64
	// Refund gives Hits back instead of taking them.
	Refund bool
	// Charge marks Hits already used (the tokens a response reported
	// when it ended): they are taken whatever the limits hold, into debt
	// down to each limit's floor (bucket.Charge), and refill repays the
	// debt before anything is admitted again. The decision still says
	// whether the limits held them. Ignored with Refund.
	Charge bool
	// Paid is, for a charge, what this replica's leases paid of it
	// already, per limit (the entity's bucket's, then the parent's), in
	// millitokens: the backend charges the rest (bucket.ChargeLess). Nil
	// for nothing.
	Paid []int64
	// Global marks the limits of a rule marked global: the backend
	// enforces its region's part of them (Global).
	Global bool
	// Bulk marks a take for a holder that paces the tokens itself, as an
	// Envoy enforcing a quota assignment does: the store decides it,
	// never this replica's leases (which neither pay it nor deny it
	// while a grant is on its way), and it is not counted in the demand
	// leases are sized by. Such takes are rare and large, and a lease
	// grown to hold them would only keep tokens idle between them.
	// Backends without leases ignore it.
	Bulk bool
}

// Decision is a backend's answer to a Request.
type Decision struct {
	// Allowed is false when any limit lacked the tokens.
	Allowed bool
	// Limits and Results cover every limit charged: the entity's bucket
	// first, then the parent's. Both are empty when no level gave the
	// bucket any limit (the request is not limited). Limits may be the
	// backend's own resolved limits, shared with other decisions: read
	// them, never write to them.
	Limits  []bucket.Limit
	Results []bucket.Result
	// Binding indexes the limit that explains the decision (see
	// bucket.Binding), or -1 when there are no limits.
	Binding int
	// Level is where the entity bucket's limits came from.
	Level Level
}

// Limited reports whether any limit applied to the request.
func (d Decision) Limited() bool { return d.Binding >= 0 }

// NotLimited is the decision for a bucket that no level gives any limit.
func NotLimited() Decision { return Decision{Allowed: true, Binding: -1} }

// Apply charges req to limits whose states are given, at now, updating
// the states in place: a refund gives Hits back (and is always allowed),
// anything else is an all-or-nothing decision (bucket.Decide). It returns
// one Result per limit.
func Apply(req *Request, limits []bucket.Limit, states []bucket.State, now int64) ([]bucket.Result, bool) {
	results := make([]bucket.Result, len(limits))
	switch {
	case req.Refund:
		bucket.Refund(limits, states, req.Hits, now, results)
		return results, true
	case req.Charge:
		return results, bucket.ChargeLess(limits, states, req.Hits, req.Paid, now, results)
	}
	return results, bucket.Decide(limits, states, req.Hits, now, results)
}
