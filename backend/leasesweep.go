package backend

import (
	"context"
	"sync"
	"time"
)

// Sweep gives back the leases due (Due) every quarter horizon, at most a
// second apart, until ctx ends; giveBack makes one return, and clears
// its lease's busy mark (Idle) when done.
func (ls *Leases[K]) Sweep(ctx context.Context, now func() int64, giveBack func(context.Context, LeaseBucket[K])) {
	every := min(max(time.Duration(ls.Horizon())*time.Millisecond/4, 10*time.Millisecond), time.Second)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		ls.ReturnAll(ctx, ls.Due(now()), giveBack)
	}
}

// ReturnAll gives the leases of bs back with giveBack, a few at a time,
// and returns when every one is done.
func (ls *Leases[K]) ReturnAll(ctx context.Context, bs []LeaseBucket[K], giveBack func(context.Context, LeaseBucket[K])) {
	const parallel = 8
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for _, b := range bs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			giveBack(ctx, b)
		})
	}
	wg.Wait()
}
