package backend

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice/backend/sharecache"
	"github.com/sluice-rl/sluice/backend/usage"
	"github.com/sluice-rl/sluice/regions"
)

// Moving is what a replica whose global shares move (Global.Moving)
// keeps beside its backend: its copies of its region's share records,
// and what it was asked for each global key in each sync window, which
// it writes to its region's store once the window is over. A backend
// makes one with NewMoving and closes nothing: its Report loop ends with
// the context it runs under.
type Moving struct {
	global Global
	shares *sharecache.Cache
	usage  *usage.Counter
	write  WriteUsage
	now    func() int64

	written, failed atomic.Uint64
}

// WriteUsage adds one replica's sums of a slot into its region's store,
// where the region's sync and the others' read them.
type WriteUsage func(ctx context.Context, slot regions.Slot, counts map[regions.Key]int64) error

// NewMoving is the Moving of a replica of g (which moves), reading share
// records with read, writing its usage with write, and keeping at most
// size keys of records and of sums; now is its clock in epoch
// milliseconds.
func NewMoving(g Global, read sharecache.Read, write WriteUsage, size int, now func() int64) (*Moving, error) {
	if !g.Moves() {
		return nil, errors.New("global shares that do not move need no share records")
	}
	cacheFor := time.Duration(g.Clock().CacheFor()) * time.Millisecond
	shares, err := sharecache.New(read, cacheFor, size, now)
	if err != nil {
		return nil, err
	}
	return &Moving{global: g, shares: shares, usage: usage.New(size), write: write, now: now}, nil
}

// enforce is res as req enforces it on entity's bucket, for a global
// rule, under its region's share record of the key; it counts what req
// asked of the limit (before its scaling: demand is in parts of the
// whole limit).
func (m *Moving) enforce(ctx context.Context, req *Request, entity string, res Resolved) (Resolved, error) {
	rec, err := m.shares.Get(ctx, entity, req.Resource)
	if err != nil {
		return Resolved{}, err
	}
	now := m.now()
	if req.Hits > 0 && !req.Refund {
		c := m.global.Clock()
		m.usage.Add(regions.Key{Entity: entity, Resource: req.Resource}, c.At(now), regions.Asked(res.Limits, int64(req.Hits), c.Window))
	}
	return m.global.ApplyShare(res, rec, now), nil
}

// Prefetch starts reading the share record of req's key when req is for
// a global rule and its record is not cached (sharecache.Cache.Prefetch),
// before its backend reads the entity's config records: a key's first
// decision then waits for one round trip, not two. Safe on a nil Moving.
func (m *Moving) Prefetch(ctx context.Context, req *Request) {
	if m == nil || !req.Global {
		return
	}
	m.shares.Prefetch(ctx, req.Entity, req.Resource)
}

// Flush writes the sums of every slot that is over, oldest first, and
// reports what it could not write: those sums are lost (the region's
// demand reads low for that window). Report runs it early in every
// window.
func (m *Moving) Flush(ctx context.Context) error {
	var errs []error
	for _, s := range m.usage.Take(m.global.Clock().At(m.now())) {
		if len(s.Counts) == 0 {
			continue
		}
		if err := m.write(ctx, s.Slot, s.Counts); err != nil {
			m.failed.Add(1)
			errs = append(errs, fmt.Errorf("writing the usage of slot %d: %w", s.Slot, err))
		} else {
			m.written.Add(1)
		}
	}
	return errors.Join(errs...)
}

// ReportSpread is the part of a window, from its start, over which the
// replicas spread the writes of the window before: a sync reads a slot's
// usage after it (regions/syncer), and the writes of a fleet do not all
// land on the store at once.
const ReportSpread = 40 // a fortieth

// Report runs Flush early in every window, at a point in the first
// fortieth of it (ReportSpread) picked at random for each window, until
// ctx ends.
func (m *Moving) Report(ctx context.Context) {
	c := m.global.Clock()
	for {
		next := c.Start(c.At(m.now())+1) + rand.Int64N(max(c.Window/ReportSpread, 1))
		t := time.NewTimer(time.Duration(next-m.now()) * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wctx, cancel := context.WithTimeout(ctx, time.Duration(c.Window/2)*time.Millisecond)
		m.Flush(wctx)
		cancel()
	}
}

// MovingStats are a replica's totals of its usage reports.
type MovingStats struct {
	// Written and Failed count the windows whose sums were written and
	// those whose sums were lost to a failed write.
	Written, Failed uint64
	// Dropped counts requests left out of the sums because their window
	// already held as many keys as the replica keeps.
	Dropped int64
}

// Stats are m's totals so far.
func (m *Moving) Stats() MovingStats {
	return MovingStats{Written: m.written.Load(), Failed: m.failed.Load(), Dropped: m.usage.Dropped()}
}
