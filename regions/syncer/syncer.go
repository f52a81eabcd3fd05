// Package syncer runs one region's sync of the shares of global keys: each
// window, for each key, it reads its own region's share record and every
// other region's, and each region's demand, plans with regions.Plan, and
// writes its own record back on the condition that it is still the one
// it read. It writes to its own region's store only; it reads the others'.
// The demand it plans on comes from its Demand function.
package syncer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/regions"
)

// Store is one region's share records as a sync reads and writes them;
// the DynamoDB and Redis backends' Admins are Stores.
type Store interface {
	// GetShare reads the share record of entity's bucket for resource:
	// its version is 0 when none is stored.
	GetShare(ctx context.Context, entity, resource string) (rec regions.Record, version int64, err error)
	// PutShare writes rec on the condition that the stored record is
	// still at version, and returns the new version; a lost condition is
	// an error that wraps regions.ErrShareChanged. expireAt (epoch ms) is
	// when the store may drop the record.
	PutShare(ctx context.Context, entity, resource string, rec regions.Record, version, expireAt int64) (int64, error)
}

// Key names a global key: the bucket of Entity for Resource.
type Key struct{ Entity, Resource string }

// Demand is what region was asked for key over the last slot, in parts of
// the limit (regions.Total is the whole limit's rate).
type Demand func(ctx context.Context, region regions.Region, key Key) (int64, error)

// Sync is one region's sync. Its zero value is not usable; fill every
// field.
type Sync struct {
	Me     regions.Region
	Split  regions.Split
	Clock  regions.Clock
	Stores map[regions.Region]Store // every region's, Me's included
	Demand Demand
	// Budget bounds a write: the plan is made for a write that lands
	// this long after it, at the latest, and the write gives up then.
	Budget time.Duration
	// Now is the sync's clock in epoch milliseconds.
	Now func() int64
}

// Result is what one Step did.
type Result struct {
	Wrote bool
	// Unread lists the regions whose record or demand could not be read,
	// Refused what Plan would not copy: each an error to log and count.
	Unread, Refused []error
}

// Step runs one window's plan for key. Its error is for what stopped it
// (its own record unreadable, its write failed or lost its condition);
// the next window plans again from what the store holds then.
func (s *Sync) Step(ctx context.Context, key Key) (Result, error) {
	var r Result
	own, version, err := s.Stores[s.Me].GetShare(ctx, key.Entity, key.Resource)
	if err != nil {
		return r, fmt.Errorf("%s: its own share of %q/%q: %w", s.Me, key.Entity, key.Resource, err)
	}
	v := regions.View{Demand: map[regions.Region]int64{}, Records: map[regions.Region]regions.Record{}}
	// The other regions are far (70 ms a call across an ocean): read
	// them all at once, not one after the other.
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, region := range s.Split.Regions() {
		wg.Go(func() {
			d, derr := s.Demand(ctx, region, key)
			var rec regions.Record
			var rerr error
			if region != s.Me {
				if store, ok := s.Stores[region]; !ok {
					rerr = errors.New("no store")
				} else {
					rec, _, rerr = store.GetShare(ctx, key.Entity, key.Resource)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if derr != nil {
				r.Unread = append(r.Unread, fmt.Errorf("demand of %s: %w", region, derr))
			} else {
				v.Demand[region] = d
			}
			switch {
			case region == s.Me:
			case rerr != nil:
				r.Unread = append(r.Unread, fmt.Errorf("share of %s: %w", region, rerr))
			default:
				v.Records[region] = rec
			}
		})
	}
	wg.Wait()
	next, changed, refused := regions.Plan(s.Split, s.Clock, s.Me, s.Now()+s.Budget.Milliseconds(), own, v)
	r.Refused = refused
	if !changed {
		return r, nil
	}
	wctx, cancel := context.WithTimeout(ctx, s.Budget)
	defer cancel()
	// The store may drop the record a window after its last loan ends.
	expireAt := s.Now() + 3*s.Clock.Window
	if u := next.Until(); u > s.Clock.At(s.Now()) {
		expireAt = s.Clock.Start(u+2) + s.Clock.Window
	}
	if _, err := s.Stores[s.Me].PutShare(wctx, key.Entity, key.Resource, next, version, expireAt); err != nil {
		return r, fmt.Errorf("%s: writing its share of %q/%q: %w", s.Me, key.Entity, key.Resource, err)
	}
	r.Wrote = true
	return r, nil
}
