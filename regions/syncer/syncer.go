// Package syncer runs one region's sync of the shares of global keys: each
// window it reads what every region's replicas were asked for each
// global key over the window before (their usage), and for each key any
// region was asked for it reads its own region's share record and every
// other region's, plans with regions.Plan, and writes its own record back
// on the condition that it is still the one it read. It writes to its
// own region's store only; it reads the others'.
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
	// Usage is what the region's replicas were asked for each global key
	// in slot, in parts of its limit (regions.Asked); a key nobody asked
	// for is not in it.
	Usage(ctx context.Context, slot regions.Slot) (map[regions.Key]int64, error)
}

// Sync is one region's sync. Its zero value is not usable; fill every
// field.
type Sync struct {
	Me     regions.Region
	Split  regions.Split
	Clock  regions.Clock
	Stores map[regions.Region]Store // every region's, Me's included
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

// Step runs one window's plan for key, on demand: what each region was
// asked for it over the last slot, in parts of the limit, for every
// region whose usage was read (one missing is a region whose demand is
// not known; one read with no use of the key is there with 0). Its error
// is for what stopped it (its own record unreadable, its write failed or
// lost its condition); the next window plans again from what the store
// holds then.
func (s *Sync) Step(ctx context.Context, key regions.Key, demand map[regions.Region]int64) (Result, error) {
	var r Result
	own, version, err := s.Stores[s.Me].GetShare(ctx, key.Entity, key.Resource)
	if err != nil {
		return r, fmt.Errorf("%s: its own share of %q/%q: %w", s.Me, key.Entity, key.Resource, err)
	}
	v := regions.View{Demand: demand, Records: map[regions.Region]regions.Record{}}
	// The other regions are far (70 ms a call across an ocean): read
	// them all at once, not one after the other.
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, region := range s.Split.Regions() {
		if region == s.Me {
			continue
		}
		wg.Go(func() {
			var rec regions.Record
			var err error
			if store, ok := s.Stores[region]; !ok {
				err = errors.New("no store")
			} else {
				rec, _, err = store.GetShare(ctx, key.Entity, key.Resource)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				r.Unread = append(r.Unread, fmt.Errorf("share of %s: %w", region, err))
			} else {
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

// Round is what one window's sync of every key did.
type Round struct {
	// Slot is the slot whose usage it read: the one before the window's.
	Slot regions.Slot
	// Keys counts the keys it planned, Wrote those whose record it wrote.
	Keys, Wrote int
	// Unread lists what could not be read (a region's usage, a region's
	// record of a key), Refused the loans Plan would not copy, Failed
	// the keys whose step stopped: each an error to log and count.
	Unread, Refused, Failed []error
}

// Parallel is how many keys a sync plans at once: each step waits on
// reads across regions, so a window's keys are planned side by side.
const Parallel = 32

// Round runs one window's sync: it reads every region's usage of the
// slot before now's, and steps every key any region was asked for then.
// A key nobody asked for is left alone: its loans run out by their
// ends, and every region falls back to its base.
func (s *Sync) Round(ctx context.Context) Round {
	slot := s.Clock.At(s.Now()) - 1
	r := Round{Slot: slot}
	used := make(map[regions.Region]map[regions.Key]int64, len(s.Stores))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, region := range s.Split.Regions() {
		wg.Go(func() {
			var u map[regions.Key]int64
			var err error
			if store, ok := s.Stores[region]; !ok {
				err = errors.New("no store")
			} else {
				u, err = store.Usage(ctx, slot)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				r.Unread = append(r.Unread, fmt.Errorf("usage of %s: %w", region, err))
				return
			}
			used[region] = u
		})
	}
	wg.Wait()
	keys := map[regions.Key]bool{}
	for _, u := range used {
		for k := range u {
			keys[k] = true
		}
	}
	r.Keys = len(keys)
	sem := make(chan struct{}, Parallel)
	for k := range keys {
		demand := make(map[regions.Region]int64, len(used))
		for region, u := range used {
			demand[region] = u[k]
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			res, err := s.Step(ctx, k, demand)
			mu.Lock()
			defer mu.Unlock()
			r.Unread = append(r.Unread, res.Unread...)
			r.Refused = append(r.Refused, res.Refused...)
			if err != nil {
				r.Failed = append(r.Failed, err)
			}
			if res.Wrote {
				r.Wrote++
			}
		})
	}
	wg.Wait()
	return r
}

// Start is when in its window a sync runs its round: an eighth of the
// way in, once the replicas have written the last window's usage (they
// do within its first twentieth, backend.ReportSpread) and well before
// the quarter by which a loan for the next slot must be written.
func (s *Sync) Start(m regions.Slot) int64 { return s.Clock.Start(m) + s.Clock.Window/8 }

// Run runs a round in every window until ctx ends, and hands each to
// done.
func (s *Sync) Run(ctx context.Context, done func(Round)) {
	for {
		next := s.Start(s.Clock.At(s.Now()) + 1)
		if at := s.Start(s.Clock.At(s.Now())); at >= s.Now() {
			next = at
		}
		t := time.NewTimer(time.Duration(next-s.Now()) * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, time.Duration(s.Clock.Window/2)*time.Millisecond)
		r := s.Round(rctx)
		cancel()
		if done != nil {
			done(r)
		}
	}
}
