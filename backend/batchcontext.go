package backend

import (
	"context"
	"sync/atomic"
)

// BatchContext is the context a store call made for several decisions at
// once runs under (a write coalesced from many callers): the first one's
// values (its trace), cancelled only once every ctx has ended, so that a
// first caller with a short deadline does not fail the others, who may
// wait longer. The cancel func releases it; call it when the call is
// done.
func BatchContext(ctxs []context.Context) (context.Context, context.CancelFunc) {
	if len(ctxs) == 1 {
		return ctxs[0], func() {}
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctxs[0]))
	var live atomic.Int64
	live.Store(int64(len(ctxs)))
	stops := make([]func() bool, len(ctxs))
	for i, c := range ctxs {
		stops[i] = context.AfterFunc(c, func() {
			if live.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}
