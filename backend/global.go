package backend

import (
	"fmt"

	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/regions"
)

// Global is how a replica enforces the limits of a rule marked global
// (Request.Global) when the fleet runs in several regions, each on its
// own table or Redis: its region's part of each limit, so that the
// regions together admit no more than the limit (DESIGN section 14). The
// zero Global enforces them whole, as a fleet in one region does.
type Global struct {
	region regions.Region
	parts  int64 // of regions.Total; 0 in the zero Global
}

// NewGlobal is the Global of a replica in region, one of split's.
func NewGlobal(split regions.Split, region regions.Region) (Global, error) {
	if !split.Has(region) {
		return Global{}, fmt.Errorf("region %q is not one of the global limits' regions %v", region, split.Regions())
	}
	return Global{region: region, parts: split.Base(region)}, nil
}

// Region is the replica's region; "" in the zero Global.
func (g Global) Region() regions.Region { return g.region }

// Parts is what g enforces of a global limit, in regions.Total parts.
func (g Global) Parts() int64 {
	if g.parts == 0 {
		return regions.Total
	}
	return g.parts
}

// Apply is res as a request enforces it: scaled to g's part when the
// request's rule is global, as it is otherwise. The scaled limits are a
// new slice: res.Limits may be shared.
func (g Global) Apply(global bool, res Resolved) Resolved {
	if !global || g.parts == 0 || len(res.Limits) == 0 {
		return res
	}
	scaled := make([]bucket.Limit, len(res.Limits))
	for i, l := range res.Limits {
		scaled[i] = regions.Scale(l, g.parts)
	}
	res.Limits = scaled
	return res
}
