// Package syncer runs one region's sync of the shares of global keys: each
// window it reads what every region's replicas were asked for each
// global key over the window before (their usage), and for each key any
// region was asked for it reads its own region's share record and every
// other region's, plans with regions.Plan, and writes its own record back
// on the condition that it is still the one it read. It writes to its
// own region's store only; it reads the others'.
package syncer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/regions"
)

// Store is one region's share records as a sync reads and writes them;
// the DynamoDB and Redis backends' Admins are Stores.
type Store interface {
	// PutShare writes rec on the condition that the stored record is
	// still at version, and returns the new version; a lost condition is
	// an error that wraps regions.ErrShareChanged. expireAt (epoch ms) is
	// when the store may drop the record.
	PutShare(ctx context.Context, entity, resource string, rec regions.Record, version, expireAt int64) (int64, error)
	// GetShares reads the share records of keys, lined up with keys, in
	// as few calls as the store allows (a record's version is 0 when none
	// is stored); consistent asks for reads that see every write before
	// them (a region's own records, which the sync writes on their
	// version). Its error is for the whole call, a Stored's for its key
	// alone.
	GetShares(ctx context.Context, keys []regions.Key, consistent bool) ([]regions.Stored, error)
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
	// Shares is what each region whose record was read holds of the
	// limit in the slot under way, by that record (its own by the record
	// it planned), in parts; the demand the step planned on is its
	// argument.
	Shares map[regions.Region]int64
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
	res, errs := s.steps(ctx, []regions.Key{key}, []map[regions.Region]int64{demand}, false)
	return res[0], errs[0]
}

// steps is Step for many keys, demands lined up with keys, their records
// read in batches: every key's own record at once (strongly consistent),
// then, for the keys that are not idle, every other region's records at
// once, each region's in one batch, all regions side by side (eventually
// consistent: a stale record holds fewer loans, and only delays). The
// writes go Parallel at a time. second is for a window's second round
// (Starts), which only copies in loans and takes back what was given
// back.
func (s *Sync) steps(ctx context.Context, keys []regions.Key, demands []map[regions.Region]int64, second bool) ([]Result, []error) {
	results, errs := make([]Result, len(keys)), make([]error, len(keys))
	own, err := s.getShares(ctx, s.Me, keys, true)
	if err != nil {
		for i, k := range keys {
			errs[i] = fmt.Errorf("%s: its own share of %q/%q: %w", s.Me, k.Entity, k.Resource, err)
		}
		return results, errs
	}
	m := s.Clock.At(s.Now())
	var busy []int
	for i, k := range keys {
		switch {
		case own[i].Err != nil:
			errs[i] = fmt.Errorf("%s: its own share of %q/%q: %w", s.Me, k.Entity, k.Resource, own[i].Err)
		case s.idle(own[i].Record, demands[i], m, second):
			results[i].Shares = map[regions.Region]int64{s.Me: own[i].Record.Share(s.Split, s.Me, m)}
		default:
			busy = append(busy, i)
		}
	}
	if len(busy) == 0 {
		return results, errs
	}
	busyKeys := make([]regions.Key, len(busy))
	for j, i := range busy {
		busyKeys[j] = keys[i]
	}
	others := slices.DeleteFunc(s.Split.Regions(), func(r regions.Region) bool { return r == s.Me })
	far, farErr := s.shares(ctx, others, busyKeys, false)
	var wg sync.WaitGroup
	sem := make(chan struct{}, Parallel)
	for j, i := range busy {
		v := regions.View{Demand: demands[i], Records: map[regions.Region]regions.Record{}}
		var unread []error
		for region, err := range farErr {
			if err == nil {
				err = far[region][j].Err
			}
			if err != nil {
				unread = append(unread, fmt.Errorf("share of %s: %w", region, err))
				continue
			}
			v.Records[region] = far[region][j].Record
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			results[i], errs[i] = s.plan(ctx, keys[i], own[i], v)
			results[i].Unread = unread
		})
	}
	wg.Wait()
	return results, errs
}

// getShares reads keys' records in region (Store.GetShares), one for
// each key.
func (s *Sync) getShares(ctx context.Context, region regions.Region, keys []regions.Key, consistent bool) ([]regions.Stored, error) {
	store, ok := s.Stores[region]
	if !ok {
		return nil, errors.New("no store")
	}
	got, err := store.GetShares(ctx, keys, consistent)
	if err == nil && len(got) != len(keys) {
		err = fmt.Errorf("%d records for %d keys", len(got), len(keys))
	}
	return got, err
}

// shares reads keys' records in every region of among at once, not one
// region after the other: the other regions are far (70 ms a call across
// an ocean). A region whose read failed has its error in errs.
func (s *Sync) shares(ctx context.Context, among []regions.Region, keys []regions.Key, consistent bool) (got map[regions.Region][]regions.Stored, errs map[regions.Region]error) {
	got, errs = map[regions.Region][]regions.Stored{}, map[regions.Region]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, region := range among {
		wg.Go(func() {
			st, err := s.getShares(ctx, region, keys, consistent)
			mu.Lock()
			defer mu.Unlock()
			got[region], errs[region] = st, err
		})
	}
	wg.Wait()
	return got, errs
}

// plan plans key from its own record and the view of the other regions,
// and writes its record when the plan changed it.
func (s *Sync) plan(ctx context.Context, key regions.Key, own regions.Stored, v regions.View) (Result, error) {
	var r Result
	next, changed, refused := regions.Plan(s.Split, s.Clock, s.Me, s.Now()+s.Budget.Milliseconds(), own.Record, v)
	r.Refused = refused
	m := s.Clock.At(s.Now())
	r.Shares = map[regions.Region]int64{s.Me: next.Share(s.Split, s.Me, m)}
	for region, rec := range v.Records {
		r.Shares[region] = rec.Share(s.Split, region, m)
	}
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
	if _, err := s.Stores[s.Me].PutShare(wctx, key.Entity, key.Resource, next, own.Version, expireAt); err != nil {
		return r, fmt.Errorf("%s: writing its share of %q/%q: %w", s.Me, key.Entity, key.Resource, err)
	}
	r.Wrote = true
	return r, nil
}

// Round is what one window's sync of every key did.
type Round struct {
	// Slot is the slot whose usage it read: the one before the window's.
	Slot regions.Slot
	// Keys are the keys it planned, Wrote counts those whose record it
	// wrote.
	Keys  []KeyRound
	Wrote int
	// Took is how long the round ran.
	Took time.Duration
	read read
	// Unread lists what could not be read (a region's usage, a region's
	// record of a key), Refused the loans Plan would not copy, Failed
	// the keys whose step stopped: each an error to log and count.
	Unread, Refused, Failed []error
}

// KeyRound is one key's part of a Round: what each region was asked for
// it over the slot read (a region whose usage could not be read is
// missing) and what each region holds of it now (Result.Shares), in
// parts of the limit.
type KeyRound struct {
	Key            regions.Key
	Demand, Shares map[regions.Region]int64
}

// Parallel is how many keys' records a sync writes at once: each write
// waits on its region's store, so a window's writes go side by side.
const Parallel = 32

// Round runs one window's sync: it reads every region's usage of the
// slot before now's, and steps every key any region was asked for then.
// A key nobody asked for is left alone: its loans run out by their
// ends, and every region falls back to its base.
func (s *Sync) Round(ctx context.Context) Round { return s.round(ctx, false, nil) }

// SecondRound is a window's second round (Starts): it reads what Round
// reads, and copies in the loans the other regions' first rounds made
// and takes back what was given back, for the keys that may have any.
func (s *Sync) SecondRound(ctx context.Context) Round { return s.round(ctx, true, nil) }

// read is what a round read of the regions' usage of a slot: a second
// round of the same window reuses it, reading again only the regions the
// first could not (a finished slot's usage does not change).
type read struct {
	slot regions.Slot
	used map[regions.Region]map[regions.Key]int64
}

func (s *Sync) round(ctx context.Context, second bool, prior *read) Round {
	started := time.Now()
	r := Round{Slot: s.Clock.At(s.Now()) - 1}
	used, unread := s.usage(ctx, r.Slot, prior)
	r.Unread = unread
	r.read = read{slot: r.Slot, used: used}
	keys := usedKeys(used)
	demands := make([]map[regions.Region]int64, len(keys))
	for i, k := range keys {
		demands[i] = demandOf(k, used)
	}
	results, errs := s.steps(ctx, keys, demands, second)
	for i, k := range keys {
		res := results[i]
		r.Keys = append(r.Keys, KeyRound{Key: k, Demand: demands[i], Shares: res.Shares})
		r.Unread = append(r.Unread, res.Unread...)
		r.Refused = append(r.Refused, res.Refused...)
		if errs[i] != nil {
			r.Failed = append(r.Failed, errs[i])
		}
		if res.Wrote {
			r.Wrote++
		}
	}
	slices.SortFunc(r.Keys, func(a, b KeyRound) int { return compareKeys(a.Key, b.Key) })
	r.Took = time.Since(started)
	return r
}

// idle reports whether a step of a key whose record is own, with demand,
// in slot m, has nothing to do, and need not read the other regions'
// records (two of the three reads a step makes, across an ocean). In a
// first round: when own holds no loan for m or later and every region's
// demand is known and fits its base, nobody lends (regions.Fits). In a
// second: when no loan is coming (its own demand fits its base) and own
// lends nothing that could be given back.
func (s *Sync) idle(own regions.Record, demand map[regions.Region]int64, m regions.Slot, second bool) bool {
	if second {
		d, ok := demand[s.Me]
		return ok && regions.Fits(s.Split, s.Me, d) && !own.Lends(m)
	}
	if own.Until() >= m {
		return false
	}
	for _, r := range s.Split.Regions() {
		if d, ok := demand[r]; !ok || !regions.Fits(s.Split, r, d) {
			return false
		}
	}
	return true
}

// usage reads every region's usage of slot at once; a region whose usage
// could not be read is missing from used, and its error in unread.
func (s *Sync) usage(ctx context.Context, slot regions.Slot, prior *read) (used map[regions.Region]map[regions.Key]int64, unread []error) {
	used = make(map[regions.Region]map[regions.Key]int64, len(s.Stores))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, region := range s.Split.Regions() {
		if u, ok := prior.get(slot, region); ok {
			used[region] = u
			continue
		}
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
				unread = append(unread, fmt.Errorf("usage of %s: %w", region, err))
				return
			}
			used[region] = u
		})
	}
	wg.Wait()
	return used, unread
}

// get is region's usage of slot as p read it, if it did.
func (p *read) get(slot regions.Slot, region regions.Region) (map[regions.Key]int64, bool) {
	if p == nil || p.slot != slot {
		return nil, false
	}
	u, ok := p.used[region]
	return u, ok
}

// usedKeys lists the keys any region used, in order.
func usedKeys(used map[regions.Region]map[regions.Key]int64) []regions.Key {
	keys := map[regions.Key]bool{}
	for _, u := range used {
		for k := range u {
			keys[k] = true
		}
	}
	return slices.SortedFunc(maps.Keys(keys), compareKeys)
}

// demandOf is k's demand in every region whose usage was read: 0 where
// it was not used.
func demandOf(k regions.Key, used map[regions.Region]map[regions.Key]int64) map[regions.Region]int64 {
	demand := make(map[regions.Region]int64, len(used))
	for region, u := range used {
		demand[region] = u[k]
	}
	return demand
}

func compareKeys(a, b regions.Key) int {
	return cmp.Or(cmp.Compare(a.Entity, b.Entity), cmp.Compare(a.Resource, b.Resource))
}

// Starts are when in each window a sync runs its rounds, in ms from the
// window's start by its clock.
//
// The first comes once every replica has written the last window's
// usage: replicas write it within the first fortieth of a window by
// their own clocks (backend.ReportSpread), which may be Skew ahead of
// the sync's, so it waits Skew and a twentieth. That leaves time for its
// reads across regions and its write (DefaultBudget) before the quarter
// by which a loan for the next window must be written: there it lends,
// gives back and borrows. A key planned later has its loans start a
// window later.
//
// The second comes once every region's first round has written its
// loans, by a quarter into the window on a clock up to Skew off, and a
// fortieth more: there it copies in the loans made to it and takes back
// what was given back, so that its replicas read them before the next
// window begins.
func (s *Sync) Starts() [2]int64 {
	w := s.Clock.Window
	return [2]int64{s.Clock.Skew + w/20, w/4 + s.Clock.Skew + w/40}
}

// next is the first time a round starts at or after now.
func (s *Sync) next(now int64) int64 {
	m := s.Clock.At(now)
	for _, slot := range []regions.Slot{m, m + 1} {
		for _, off := range s.Starts() {
			if at := s.Clock.Start(slot) + off; at >= now {
				return at
			}
		}
	}
	return s.Clock.Start(m+1) + s.Starts()[0]
}

// DefaultBudget is the Budget of a sync on clock c: a fortieth of a
// window (250 ms for 10 s), fifty times a write to a region's own store.
func DefaultBudget(c regions.Clock) time.Duration {
	return time.Duration(c.Window/40) * time.Millisecond
}

// Run runs its rounds in every window (Starts) until ctx ends, and
// hands each to done. A window's second round reuses the usage its first
// read. A round is given until the next starts, at most
// half a window.
func (s *Sync) Run(ctx context.Context, done func(Round)) {
	var last Round
	for {
		next := s.next(s.Now())
		t := time.NewTimer(time.Duration(next-s.Now()) * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, time.Duration(min(s.next(next+1)-next, s.Clock.Window/2))*time.Millisecond)
		second := next-s.Clock.Start(s.Clock.At(next)) >= s.Starts()[1]
		var prior *read
		if second {
			prior = &last.read
		}
		r := s.round(rctx, second, prior)
		cancel()
		last = r
		if done != nil {
			done(r)
		}
	}
}

// Survey reads what a Round reads and writes nothing: for each of keys
// (none: every key any region used over the last slot), what each region
// was asked for it over that slot and what each holds of it in the slot
// under way, by its own record. It is what an operator looks at
// (`sluice shares`); unread lists what could not be read.
//
// The last slot is the last one whose usage every replica has written:
// before the first round of a slot (Starts), the one before the slot
// just ended. A survey just after a boundary would otherwise find the
// ended slot's usage partly written, or not at all, and list nothing.
func (s *Sync) Survey(ctx context.Context, keys []regions.Key) (rows []KeyRound, unread []error) {
	now := s.Now()
	m := s.Clock.At(now)
	last := m - 1
	if now < s.Clock.Start(m)+s.Starts()[0] {
		last--
	}
	used, unread := s.usage(ctx, last, nil)
	if len(keys) == 0 {
		keys = usedKeys(used)
	}
	rows = make([]KeyRound, len(keys))
	for i, k := range keys {
		rows[i] = KeyRound{Key: k, Demand: demandOf(k, used), Shares: map[regions.Region]int64{}}
	}
	got, errs := s.shares(ctx, s.Split.Regions(), keys, true)
	for _, region := range s.Split.Regions() {
		if err := errs[region]; err != nil {
			unread = append(unread, fmt.Errorf("shares of %s: %w", region, err))
			continue
		}
		for i, st := range got[region] {
			if st.Err != nil {
				unread = append(unread, fmt.Errorf("share of %s: %w", region, st.Err))
				continue
			}
			rows[i].Shares[region] = st.Record.Share(s.Split, region, m)
		}
	}
	return rows, unread
}
