package regions

import "github.com/sluice-rl/sluice/backend/bucket"

// Key names a global key: the bucket an entity holds for a resource.
type Key struct{ Entity, Resource string }

// Asked is how much of a limit a request of hits asks for over a window
// of window milliseconds, in parts (Total is the whole rate of the
// limit for the window): of the request's limits, the one it asks the
// most of. A limit that refills nothing counts as a hundred limits, as
// much as Targets plans for. Budgets do not count: their parts do not
// follow demand (backend.Global.ApplyShare). Summed over a slot's
// requests it is the demand a sync plans on; a float, because a single
// request is a small fraction of a part of a busy limit.
func Asked(limits []bucket.Limit, hits, window int64) float64 {
	var most float64
	for _, l := range limits {
		if l.IsBudget() {
			continue
		}
		cost := float64(hits) * bucket.Milli
		if l.PerRequest {
			cost = bucket.Milli
		}
		if cost <= 0 {
			continue
		}
		if l.Amount <= 0 {
			return 100 * Total
		}
		// cost / (Amount per Period * window) of the limit.
		most = max(most, min(cost*float64(l.Period)*Total/(float64(l.Amount)*float64(window)), 100*Total))
	}
	return most
}
