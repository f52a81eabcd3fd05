package dynamodb

import (
	"context"
	"time"

	"github.com/sluice-rl/sluice/backend"
	"github.com/sluice-rl/sluice/backend/bucket"
)

// A replica's leases (DESIGN section 11) are kept by backend.Leases; this
// file holds what the DynamoDB backend does with them: renewals and
// returns are calls of their own kind through a bucket's lane, written
// with the same conditional write a decision makes, so a token gets into
// a lease only through a write that took it out of the table's bucket.

// leased is t's bucket as its lease sees it.
func (t *target) leased() backend.LeaseBucket[bucketKey] {
	return backend.LeaseBucket[bucketKey]{Key: t.key, Res: t.res, FP: t.fp}
}

// view is t's item as a lease reads it; nil when there is none.
func (t *target) view() backend.BucketView {
	if t.item == nil {
		return nil
	}
	return t.item
}

// leasedAll lists the buckets of ts as their leases see them.
func leasedAll(ts []target) []backend.LeaseBucket[bucketKey] {
	out := make([]backend.LeaseBucket[bucketKey], len(ts))
	for i := range ts {
		out[i] = ts[i].leased()
	}
	return out
}

// targetOf is the target a renewal or return of lb's lease writes.
func targetOf(lb backend.LeaseBucket[bucketKey]) target {
	return target{key: lb.Key, res: lb.Res, fp: lb.FP}
}

// returnLease gives lb's lease back to its bucket (Leases.Sweep, Close).
func (b *Backend) returnLease(ctx context.Context, lb backend.LeaseBucket[bucketKey]) {
	b.background(ctx, targetOf(lb), giveBack)
}

// backgroundTimeout bounds a renewal's or a return's write, and a
// decision's write once its callers may have stopped waiting (detach).
const backgroundTimeout = 5 * time.Second

// background makes a renewal or a return of t's lease through t's lane,
// as a call of its own kind, and clears the lease's busy mark after.
func (b *Backend) background(ctx context.Context, t target, kind callKind) {
	defer b.leases.Idle(t.key)
	ctx, cancel := context.WithTimeout(ctx, backgroundTimeout)
	defer cancel()
	c := newCall(ctx, &backend.Request{Entity: t.key.entity, Resource: t.key.resource}, t.group())
	c.kind = kind
	batch, err := b.lanes.enter(ctx, c, t.key)
	if err != nil || batch == nil {
		return // gave up waiting, or another batch took it along
	}
	ts := []target{t}
	if len(batch) == 1 {
		defer b.lanes.leave(t.key)
		b.decideBatch(ctx, ts, batch)
		return
	}
	_ = b.lead(ctx, ts, []bucketKey{t.key}, batch)
}

// spend answers req from this replica's leases on every bucket of ts
// (backend.Leases.Spend), and renews in the background the leases it
// leaves low. arriving: the call has just come (not handed back from a
// batch), and counts as demand whether the lease pays it or not.
func (b *Backend) spend(ts []target, req *backend.Request, level backend.Level, arriving bool) (backend.Decision, bool) {
	results, renew, paid := b.leases.Spend(leasedAll(ts), req.Hits, b.now(), b.rtt.Ms(), arriving)
	if !paid {
		return backend.Decision{}, false
	}
	return b.paid(ts, results, renew, level), true
}

// paid is the admission of a call the leases paid with results, and
// renews in the background the leases it left low.
func (b *Backend) paid(ts []target, results []bucket.Result, low []backend.LeaseBucket[bucketKey], level backend.Level) backend.Decision {
	for _, lb := range low {
		t := targetOf(lb)
		b.bg.Go(func() { b.background(b.bg.Context(), t, renewal) })
	}
	var limits []bucket.Limit
	for i := range ts {
		limits = append(limits, ts[i].res.Limits...)
	}
	b.stats.LocalAnswers.Add(1)
	return backend.Decision{Allowed: true, Limits: limits, Results: results,
		Binding: bucket.Binding(limits, results), Level: level}
}
