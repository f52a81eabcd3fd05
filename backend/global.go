package backend

import (
	"context"
	"fmt"

	"github.com/sluice-rl/sluice/backend/bucket"
	"github.com/sluice-rl/sluice/regions"
)

// Global is how a replica enforces the limits of a rule marked global
// (Request.Global) when the fleet runs in several regions, each on its
// own table or Redis: its region's part of each limit, so that the
// regions together admit no more than the limit (DESIGN section 14). The
// zero Global enforces them whole, as a fleet in one region does.
//
// A Global made by NewGlobal enforces its region's base, fixed by weight.
// One made Moving enforces what its region's share record of each key
// gives it (regions.Record.InForce), read from the region's store: the
// base, less what the region lent, plus what it borrowed.
type Global struct {
	region regions.Region
	split  regions.Split
	clock  regions.Clock
	moving bool
}

// NewGlobal is the Global of a replica in region, one of split's.
func NewGlobal(split regions.Split, region regions.Region) (Global, error) {
	if !split.Has(region) {
		return Global{}, fmt.Errorf("region %q is not one of the global limits' regions %v", region, split.Regions())
	}
	return Global{region: region, split: split}, nil
}

// Moving is g with shares that follow its region's share records, on the
// regions' clock c (every region's replicas and syncs use the same).
func (g Global) Moving(c regions.Clock) (Global, error) {
	if g.region == "" {
		return Global{}, fmt.Errorf("moving shares need a region")
	}
	if err := c.Validate(); err != nil {
		return Global{}, err
	}
	g.clock, g.moving = c, true
	return g, nil
}

// Moves reports whether g follows share records.
func (g Global) Moves() bool { return g.moving }

// Clock is the regions' clock of a moving Global.
func (g Global) Clock() regions.Clock { return g.clock }

// Parts is what g enforces of a global limit, in regions.Total parts,
// with no share record: its region's base (the whole limit in the zero
// Global).
func (g Global) Parts() int64 {
	if g.region == "" {
		return regions.Total
	}
	return g.split.Base(g.region)
}

// Apply is res as a request enforces it: scaled to g's base when the
// request's rule is global, as it is otherwise.
func (g Global) Apply(global bool, res Resolved) Resolved {
	if !global || g.region == "" {
		return res
	}
	return scale(res, g.Parts(), g.Parts())
}

// ApplyShare is res as a request of a global rule enforces it on a
// moving Global, under its region's share record rec of the key, while
// the replica's clock reads now (ms). Its rates follow the share; its
// budgets keep the region's base part: a period's tokens that one
// region has spent cannot move to another when demand does, so a
// budget whose part followed demand could be spent once under a large
// part and again elsewhere after the part moved.
func (g Global) ApplyShare(res Resolved, rec regions.Record, now int64) Resolved {
	return scale(res, rec.InForce(g.split, g.region, g.clock, now), g.Parts())
}

// Enforce is res, the limits entity's bucket resolved to, as req
// enforces them: scaled to this region's part when req's rule is global;
// with shares that move, from the key's share record m keeps (a record
// that cannot be read fails the decision), counting what req asked. m is
// nil unless g moves.
func (g Global) Enforce(ctx context.Context, req *Request, entity string, res Resolved, m *Moving) (Resolved, error) {
	if !req.Global || m == nil {
		return g.Apply(req.Global, res), nil
	}
	return m.enforce(ctx, req, entity, res)
}

// scale is res with its rates scaled to parts and its budgets to
// budgetParts, in a new slice: res's may be shared.
func scale(res Resolved, parts, budgetParts int64) Resolved {
	if len(res.Limits) == 0 {
		return res
	}
	scaled := make([]bucket.Limit, len(res.Limits))
	for i, l := range res.Limits {
		if l.IsBudget() {
			scaled[i] = regions.Scale(l, budgetParts)
			continue
		}
		scaled[i] = regions.Scale(l, parts)
	}
	res.Limits = scaled
	res.Regional = true
	return res
}
