package backend

import (
	"context"
	"sync"
	"time"
)

// Background runs a backend's work that outlives the calls that start
// it (lease renewals and returns, writes whose callers have stopped
// waiting, the sweep of idle leases) and ends it on Close. The zero value
// is not usable; see NewBackground.
type Background struct {
	ctx    context.Context
	cancel context.CancelFunc
	// sweep is cancelled first on Close: it only starts work.
	sweep       context.Context
	cancelSweep context.CancelFunc

	mu     sync.Mutex // guards closed and wg's Add
	closed bool
	wg     sync.WaitGroup
}

// NewBackground returns a Background ready to run work.
func NewBackground() *Background {
	g := &Background{}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	g.sweep, g.cancelSweep = context.WithCancel(g.ctx)
	return g
}

// Context is cancelled once Close has given the work under way its
// grace: work started in the background runs under it.
func (g *Background) Context() context.Context { return g.ctx }

// SweepContext is cancelled as soon as Close begins: for loops that only
// start work, such as a sweep of leases.
func (g *Background) SweepContext() context.Context { return g.sweep }

// Go runs fn on a goroutine of its own that Close waits for, and reports
// true; once Close has begun it does nothing and reports false.
func (g *Background) Go(fn func()) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		fn()
	}()
	return true
}

// Close stops new work and the sweep, lets the work under way finish
// within grace, then cancels what is left and waits for it. Writes in
// flight land before anything is cancelled: one cancelled once sent may
// still move tokens in the store, with nobody left to spend or return
// them. It reports false when Close had already been called.
func (g *Background) Close(grace time.Duration) bool {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return false
	}
	g.closed = true
	g.mu.Unlock()
	g.cancelSweep()
	drained := make(chan struct{})
	go func() { g.wg.Wait(); close(drained) }()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-drained:
	case <-t.C:
	}
	g.cancel()
	<-drained
	return true
}
