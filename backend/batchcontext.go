package backend

import (
	"context"
	"sync/atomic"
	"time"
)

// BatchContext is the context a store call made for several decisions at
// once runs under (a write coalesced from many callers): the first one's
// values (its trace), and alive until the last caller stops waiting, so
// that a first caller with a short deadline does not fail the others, who
// may wait longer. The cancel func releases it; call it when the call is
// done.
//
// When every ctx has a deadline (the service gives every decision one),
// the batch ends at the latest of them, even if its callers are all
// cancelled sooner: the call then finishes its work or times out, and
// nobody waits for it, as each caller answers by its own ctx. That costs
// one timer per batch instead of a watch on every caller's ctx. Otherwise
// it ends once every ctx has ended.
func BatchContext(ctxs []context.Context) (context.Context, context.CancelFunc) {
	if len(ctxs) == 1 {
		return ctxs[0], func() {}
	}
	base := context.WithoutCancel(ctxs[0])
	var last time.Time
	for _, c := range ctxs {
		d, ok := c.Deadline()
		if !ok {
			return whileAny(base, ctxs)
		}
		if d.After(last) {
			last = d
		}
	}
	return context.WithDeadline(base, last)
}

// whileAny is base, cancelled once every ctx has ended.
func whileAny(base context.Context, ctxs []context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(base)
	var live atomic.Int64
	live.Store(int64(len(ctxs)))
	ended := func() {
		if live.Add(-1) == 0 {
			cancel()
		}
	}
	stops := make([]func() bool, len(ctxs))
	for i, c := range ctxs {
		stops[i] = context.AfterFunc(c, ended)
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}
